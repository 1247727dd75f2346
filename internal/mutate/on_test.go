//go:build idem_mutate

package mutate_test

import (
	"testing"

	"github.com/idemhq/idem/internal/mutate"
)

// TestOnWithTheTag: with the tag, On reports the names IDEM_MUTATE holds
// (read once, at the first call).
func TestOnWithTheTag(t *testing.T) {
	t.Setenv(mutate.Env, " park, inbox")
	for _, n := range mutate.Names {
		if want := n == mutate.Park || n == mutate.Inbox; mutate.On(n) != want {
			t.Errorf("On(%q) = %v, want %v", n, !want, want)
		}
	}
}

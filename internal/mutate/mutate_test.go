//go:build !idem_mutate

package mutate_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/internal/mutate"
)

// TestOffWithoutTheTag: without the build tag idem_mutate no switch is on,
// whatever the environment says.
func TestOffWithoutTheTag(t *testing.T) {
	t.Setenv(mutate.Env, "inbox,park")
	for _, n := range mutate.Names {
		if mutate.On(n) {
			t.Errorf("On(%q) without the tag", n)
		}
	}
}

// TestNotInProductionBuilds: a swarm member built without the tag holds
// none of the tagged code (the message a mutated build prints), so no
// production build can reach a mutation; built with it, it does.
func TestNotInProductionBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the swarm member twice")
	}
	const marker = "mechanisms switched off"
	dir := t.TempDir()
	for _, tags := range []string{"", "idem_mutate"} {
		bin := filepath.Join(dir, "member"+tags)
		cmd := exec.Command("go", "build", "-o", bin, "-tags", tags, "github.com/idemhq/idem/internal/testing/chaos/swarmmember")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build -tags %q: %v\n%s", tags, err, out)
		}
		b, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if has := bytes.Contains(b, []byte(marker)); has != (tags != "") {
			t.Errorf("built with tags %q: holds the mutated build's code: %v", tags, has)
		}
	}
}

package retrytopic_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/retrytopic"
)

// TestValidateReportsEveryProblem: Policy.Validate reports every problem at
// once (consumer.Config's idiom), each naming its field, every one matching
// ErrInvalidPolicy.
func TestValidateReportsEveryProblem(t *testing.T) {
	err := retrytopic.Policy{
		Delays:            []time.Duration{-time.Second, 0},
		ReplicationFactor: -2,
		DLQTopic:          func(string, string) string { return "" },
	}.Validate()
	if !errors.Is(err, retrytopic.ErrInvalidPolicy) {
		t.Fatalf("Validate() = %v, want an error matching ErrInvalidPolicy", err)
	}
	for _, want := range []string{"Delays[0]", "Delays[1]", "ReplicationFactor", "DLQTopic"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, want it to name %s", err, want)
		}
	}
}

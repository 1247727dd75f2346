package outbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemhq/idem/outbox"
)

// TestValidateReportsEveryProblem: Relay.Validate reports every bad field at
// once, each by name, every one matching ErrInvalidConfig (consumer.Config's
// idiom), so a user fixes a configuration in one pass.
func TestValidateReportsEveryProblem(t *testing.T) {
	err := (&outbox.Relay{BatchSize: -1, MaxAttempts: -2, PollInterval: -1}).Validate()
	if !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("Validate() = %v, want an error matching ErrInvalidConfig", err)
	}
	for _, field := range []string{"Relay.Pool", "Relay.Brokers", "Relay.BatchSize", "Relay.MaxAttempts", "Relay.PollInterval"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("Validate() = %q, want it to name %s", err, field)
		}
	}
}

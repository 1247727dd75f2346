package schedule_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemhq/idem/schedule"
)

// TestValidateReportsEveryProblem: Scheduler.Validate reports every bad
// field at once, each by name, every one matching ErrInvalidConfig.
func TestValidateReportsEveryProblem(t *testing.T) {
	err := (&schedule.Scheduler{BatchSize: -1, MaxWait: -1}).Validate()
	if !errors.Is(err, schedule.ErrInvalidConfig) {
		t.Fatalf("Validate() = %v, want an error matching ErrInvalidConfig", err)
	}
	for _, field := range []string{"Scheduler.Pool", "Scheduler.Brokers", "Scheduler.Group", "Scheduler.BatchSize", "Scheduler.MaxWait"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("Validate() = %q, want it to name %s", err, field)
		}
	}
}

package checkpoint_test

import (
	"strings"
	"testing"

	"github.com/idemhq/idem/checkpoint"
)

// TestNewRunnerReportsEveryProblem: NewRunner reports every bad field of the
// Job at once, each by name, every one an invalid-job error
// (consumer.Config's idiom).
func TestNewRunnerReportsEveryProblem(t *testing.T) {
	_, err := checkpoint.NewRunner(checkpoint.Job[int]{ChunkSize: -1})
	if err == nil || !strings.Contains(err.Error(), "checkpoint: invalid job") {
		t.Fatalf("NewRunner = %v, want an error matching ErrInvalidJob", err)
	}
	for _, field := range []string{"Job.Name", "Job.ChunkSize", "Job.Read", "Job.Process"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("NewRunner = %q, want it to name %s", err, field)
		}
	}
}

package checkpoint_test

import (
	"testing"

	"github.com/idemhq/idem/checkpoint"
	"github.com/idemhq/idem/internal/testing/docdefaults"
)

// TestDocumentedDefaults checks every "Default:" line of Job's and
// LiveTable's field docs against their defaults functions.
func TestDocumentedDefaults(t *testing.T) {
	if n := docdefaults.Check(t, ".", "Job", checkpoint.JobWithDefaults(checkpoint.Job[int]{})); n != 2 {
		t.Errorf("checked %d documented defaults of Job, want 2 (ChunkSize, Registerer)", n)
	}
	if n := docdefaults.Check(t, ".", "LiveTable", checkpoint.LiveTableWithDefaults(checkpoint.LiveTable[int]{})); n != 2 {
		t.Errorf("checked %d documented defaults of LiveTable, want 2 (ID, Xact)", n)
	}
}

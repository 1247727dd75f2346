package checkpoint

import (
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/tables"
)

// Metrics returns r's collectors.
func Metrics[R any](r *Runner[R]) *collectors { return r.m }

// DB is dedupe.DB, the handle type the package takes, for the external tests.
type DB = dedupe.DB

// JobWithDefaults is Job.withDefaults, for the external tests.
func JobWithDefaults[R any](j Job[R]) Job[R] { return j.withDefaults() }

// LiveTableWithDefaults is LiveTable.withDefaults, for the external tests.
func LiveTableWithDefaults[R any](l LiveTable[R]) LiveTable[R] { return l.withDefaults() }

// The checkpoint rows' reads and reset live in internal/tables (the
// CLI's); the external tests reach them under their old names.
type State = tables.Checkpoint

var (
	Get         = tables.GetCheckpoint
	List        = tables.ListCheckpoints
	Reset       = tables.ResetCheckpoint
	ErrNotFound = tables.ErrNoCheckpoint
)

// ErrNoProgress is wrapped by Run's error when Read does not advance the
// cursor.
var ErrNoProgress = errNoProgress

// Migrate is tables.MigrateCheckpoint (idem.Migrate runs it), for the external tests.
var Migrate = tables.MigrateCheckpoint

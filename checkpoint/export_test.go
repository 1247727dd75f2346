package checkpoint

import (
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/checkpointrow"
)

// Metrics returns r's collectors.
func Metrics[R any](r *Runner[R]) *collectors { return r.m }

// DB is dedupe.DB, the handle type the package takes, for the external tests.
type DB = dedupe.DB

// JobWithDefaults is Job.withDefaults, for the external tests.
func JobWithDefaults[R any](j Job[R]) Job[R] { return j.withDefaults() }

// LiveTableWithDefaults is LiveTable.withDefaults, for the external tests.
func LiveTableWithDefaults[R any](l LiveTable[R]) LiveTable[R] { return l.withDefaults() }

// The checkpoint rows' reads and reset live in internal/checkpointrow (the
// CLI's); the external tests reach them under their old names.
type State = checkpointrow.State

var (
	Get         = checkpointrow.Get
	List        = checkpointrow.List
	Reset       = checkpointrow.Reset
	ErrNotFound = checkpointrow.ErrNotFound
)

// ErrNoProgress is wrapped by Run's error when Read does not advance the
// cursor.
var ErrNoProgress = errNoProgress

// Migrate is checkpointrow.Migrate (idem.Migrate runs it), for the external tests.
var Migrate = checkpointrow.Migrate

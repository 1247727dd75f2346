package checkpoint

import "github.com/idemhq/idem/dedupe"

// Metrics returns r's collectors.
func Metrics[R any](r *Runner[R]) *collectors { return r.m }

// DB is dedupe.DB, the handle type the package takes, for the external tests.
type DB = dedupe.DB

// JobWithDefaults is Job.withDefaults, for the external tests.
func JobWithDefaults[R any](j Job[R]) Job[R] { return j.withDefaults() }

// LiveTableWithDefaults is LiveTable.withDefaults, for the external tests.
func LiveTableWithDefaults[R any](l LiveTable[R]) LiveTable[R] { return l.withDefaults() }

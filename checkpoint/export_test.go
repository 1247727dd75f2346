package checkpoint

import "github.com/idemhq/idem/dedupe"

// Metrics returns r's collectors.
func Metrics[R any](r *Runner[R]) *collectors { return r.m }

// DB is dedupe.DB, the handle type the package takes, for the external tests.
type DB = dedupe.DB

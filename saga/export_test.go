package saga

import "github.com/idemhq/idem/dedupe"

// SetBoundary installs the crash hook: f is called at every step boundary
// ("reserve:action:before", "reserve:action:after",
// "reserve:action:committed", "charge:compensate:before", …,
// "saga:completed"); an error from f aborts Execute there, its transaction
// rolled back, as a process crash would.
func SetBoundary(o *Orchestrator, f func(point string) error) { o.boundary = f }

// ConfigOf returns the configuration o runs with, defaults filled in.
func ConfigOf(o *Orchestrator) Config { return o.cfg }

// DefaultCompensationAttemptsForTest is Config.CompensationAttempts' default.
const DefaultCompensationAttemptsForTest = defaultCompensationAttempts

// Metrics returns o's collectors.
func Metrics(o *Orchestrator) *collectors { return o.m }

// ErrCompensationFailing is wrapped by Execute's error when a compensation
// still fails after Config.CompensationAttempts attempts.
var ErrCompensationFailing = errCompensationFailing

// DB is dedupe.DB, the handle type the package takes, for the external tests.
type DB = dedupe.DB

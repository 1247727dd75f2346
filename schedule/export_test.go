package schedule

import (
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/tables"
)

// SetAfterAck sets the test hook that runs after a round's acks and before
// its rows are deleted.
func SetAfterAck(s *Scheduler, f func(ids []int64)) { s.afterAck = f }

// Beginner is dedupe.DB, the handle type Migrate takes, for the external tests.
type Beginner = dedupe.DB

// Listing the deferred records lives in internal/tables (the CLI's);
// the external tests reach it under its old names.
type (
	Filter  = tables.DeferredFilter
	Pending = tables.Pending
)

// List is tables.ListDeferred.
var List = tables.ListDeferred

// Migrate is tables.MigrateDeferred (idem.Migrate runs it), for the external tests.
var Migrate = tables.MigrateDeferred

// Deferring a record lives in internal/tables (the consumer's); the
// external tests reach it under its old names.
type Record = tables.DeferredRecord

var (
	RecordOf         = tables.DeferredRecordOf
	Defer            = tables.Defer
	ErrInvalidRecord = tables.ErrInvalidDeferred
)

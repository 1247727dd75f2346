package schedule

import (
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/scheduletable"
)

// SetAfterAck sets the test hook that runs after a round's acks and before
// its rows are deleted.
func SetAfterAck(s *Scheduler, f func(ids []int64)) { s.afterAck = f }

// Beginner is dedupe.DB, the handle type Migrate takes, for the external tests.
type Beginner = dedupe.DB

// Listing the deferred records lives in internal/scheduletable (the CLI's);
// the external tests reach it under its old names.
type (
	Filter  = scheduletable.Filter
	Pending = scheduletable.Pending
)

// List is scheduletable.List.
var List = scheduletable.List

// Migrate is scheduletable.Migrate (idem.Migrate runs it), for the external tests.
var Migrate = scheduletable.Migrate

// Deferring a record lives in internal/scheduletable (the consumer's); the
// external tests reach it under its old names.
type Record = scheduletable.Record

var (
	RecordOf         = scheduletable.RecordOf
	Defer            = scheduletable.Defer
	ErrInvalidRecord = scheduletable.ErrInvalidRecord
)

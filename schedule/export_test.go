package schedule

import (
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/schedulelist"
)

// SetAfterAck sets the test hook that runs after a round's acks and before
// its rows are deleted.
func SetAfterAck(s *Scheduler, f func(ids []int64)) { s.afterAck = f }

// Beginner is dedupe.DB, the handle type Migrate takes, for the external tests.
type Beginner = dedupe.DB

// Listing the deferred records lives in internal/schedulelist (the CLI's);
// the external tests reach it under its old names.
type (
	Filter  = schedulelist.Filter
	Pending = schedulelist.Pending
)

// List is schedulelist.List.
var List = schedulelist.List

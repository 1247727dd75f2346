package schedule

import (
	"errors"

	"github.com/idemhq/idem/internal/scheduletable"
)

// table is the table deferred records wait in (scheduletable.Table).
const table = scheduletable.Table

// ErrInvalidConfig is matched by every problem Scheduler.Validate (and so
// Run) reports; each names the field, the value and the rule.
var ErrInvalidConfig = errors.New("schedule: invalid configuration")

package schedule

import (
	"errors"

	"github.com/idemhq/idem/internal/tables"
)

// table is the table deferred records wait in (tables.DeferredTable).
const table = tables.DeferredTable

// ErrInvalidConfig is matched by every problem Scheduler.Validate (and so
// Run) reports; each names the field, the value and the rule.
var ErrInvalidConfig = errors.New("schedule: invalid configuration")

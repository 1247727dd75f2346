package consumer

import (
	"fmt"

	"github.com/idemhq/idem/internal/configerr"
)

// StartPosition is where a group without a committed offset starts reading.
type StartPosition int

const (
	// StartOldest reads from the oldest retained record. The default.
	StartOldest StartPosition = iota
	// StartNewest reads only records produced after the group joined.
	StartNewest
)

// String returns "oldest" or "newest".
func (s StartPosition) String() string {
	switch s {
	case StartOldest:
		return "oldest"
	case StartNewest:
		return "newest"
	}
	return fmt.Sprintf("StartPosition(%d)", int(s))
}

// validateStartAt checks Config.StartAt.
func (c Config) validateStartAt(errs *configerr.List) {
	if c.StartAt != StartOldest && c.StartAt != StartNewest {
		errs.Bad("StartAt", c.StartAt, "unknown start position")
	}
}

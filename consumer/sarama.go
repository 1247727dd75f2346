package consumer

import "fmt"

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

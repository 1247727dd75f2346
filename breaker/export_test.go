package breaker

import "time"

// SetAfter makes s's waits use after instead of real timers, so that a test's
// fake clock can end them.
func SetAfter(s *Set, after func(d time.Duration) (<-chan time.Time, func() bool)) {
	s.after = after
}

// Names the package keeps unexported, for the external tests.
var (
	DefaultSettings = defaultSettings
	DefaultLimits   = defaultLimits
	ErrOpen         = errOpen
	ErrThrottled    = errThrottled
	ErrInUse        = errInUse
)

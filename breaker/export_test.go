package breaker

import "time"

// SetAfter makes s's waits use after instead of real timers, so that a test's
// fake clock can end them.
func SetAfter(s *Set, after func(d time.Duration) (<-chan time.Time, func() bool)) {
	s.after = after
}

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

// Breaker is one breaker of a Set, for the tests of the state machine.
type Breaker = circuit

// New returns a closed breaker for the dependency called name, as a Set
// makes one (zero fields of s take their defaults), announced to
// s.OnStateChange before New returns.
func New(name string, s Settings) (*Breaker, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	b := newBreaker(name, s.withDefaults(defaultSettings()))
	b.deliver() // the announcement
	return b, nil
}

// Get returns the breaker called name, creating it (closed) on first use.
func (s *Set) Get(name string) *Breaker {
	s.mu.Lock()
	b := s.breaker(name)
	s.mu.Unlock()
	b.deliver() // the announcement of a new breaker
	return b
}

// Name returns the breaker's name.
func (b *circuit) Name() string { return b.name }

// IsFailure is the default Settings.IsFailure.
var IsFailure = isFailure

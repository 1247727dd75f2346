package breaker

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
)

// State is the state of a breaker.
type State int

// The states of a breaker. The values and their String forms are those of
// gobreaker.State.
const (
	// Closed: calls go through; failures are counted.
	Closed State = iota
	// HalfOpen: the cool-down is over; up to Settings.HalfOpenProbes calls go
	// through as probes, every other call is rejected with an *OpenError.
	HalfOpen
	// Open: every call is rejected with an *OpenError until the cool-down ends.
	Open
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	default:
		return fmt.Sprintf("State(%d)", int(s))
	}
}

// Settings configures the breakers of a Set.
//
// The zero value is useful: every zero field takes the default its
// "Default:" line names.
type Settings struct {
	// ConsecutiveFailures trips the breaker (closed → open) when this many
	// calls in a row failed. Only a counted success breaks the streak; calls
	// that are not counted (see IsFailure) neither extend nor break it, and the
	// streak is not cleared when Window ends. Set it to math.MaxUint32 to trip
	// on FailureRatio only.
	// Default: 5
	ConsecutiveFailures uint32

	// FailureRatio also trips the breaker when, within the current Window,
	// failures/(failures+successes) >= FailureRatio and at least MinRequests
	// calls were counted. It is checked when a failure is counted. Calls still
	// running and calls that are not counted are not in the ratio. 0 disables
	// the ratio rule. Must be in [0,1].
	// Default: 0 (disabled)
	FailureRatio float64

	// MinRequests is how many counted calls the current Window must hold
	// before FailureRatio is applied. It has no effect while FailureRatio is 0.
	// Default: 10
	MinRequests uint32

	// Window is the length of the closed-state counting window for
	// FailureRatio (gobreaker's Interval): the success and failure totals are
	// cleared when a Window has passed since the breaker closed or since the
	// last clearing. Must be >= 0.
	// Default: 60s
	Window time.Duration

	// OpenTimeout is the cool-down: how long the breaker stays open before it
	// becomes half-open (gobreaker's Timeout). Must be >= 0.
	// Default: 30s
	OpenTimeout time.Duration

	// HalfOpenProbes is how many calls may go through while half-open
	// (gobreaker's MaxRequests). The breaker closes once that many probes
	// have succeeded; any probe failure opens it again with a fresh
	// cool-down. A probe that ends not counted frees its slot for another.
	// Default: 1
	HalfOpenProbes uint32

	// IsFailure reports whether a non-nil error returned by the call counts as
	// a failure of the dependency. When it returns false the call is not
	// counted at all: neither a success nor a failure. It is never called with
	// nil (nil is a success), nor for a call whose own ctx was done when it
	// returned a context error (such a call is never counted: the caller gave
	// up, the dependency did not fail). It must be safe for concurrent use.
	// Default: every non-nil error is a failure except errors marked
	// handler.Permanent or handler.Decode (bad input is not the dependency
	// failing) and an *OpenError or *ThrottleError of another breaker or Set
	// (IsOpen: that dependency was not even called, or asked for a pause). A
	// dependency's request to wait (a handler.RetryAfter error returned by
	// fn) is never counted, whatever IsFailure says (see Set.Do).
	IsFailure func(err error) bool

	// OnStateChange, if set, is called after every state change with the
	// breaker's name and the old and new state. For one breaker the calls are
	// made one at a time and in the order of the transitions, without the
	// breaker's lock held (so it may call State), possibly on the goroutine of
	// a later Do. Open → half-open is noticed lazily, by the first Do, State
	// or Set.States after the cool-down. Use it to export metrics and logs.
	// A new breaker is announced once, before any transition, with
	// from == to == Closed, when it is created: when a Set's Do first uses
	// its name; so a gauge of the
	// state has a series for every breaker even if it never changes state or
	// is never called. A hook that counts or logs transitions skips calls with
	// from == to.
	// Default: nil
	OnStateChange func(name string, from, to State)

	// Now is the clock. Tests set a fake clock; every timing decision of the
	// breaker (Window, OpenTimeout, RetryAfter) reads it, and nothing else.
	// Default: time.Now
	Now func() time.Time
}

// defaultSettings returns the defaults that zero fields of Settings take.
// It is the one place defaults are defined.
func defaultSettings() Settings {
	return Settings{
		ConsecutiveFailures: 5,
		FailureRatio:        0,
		MinRequests:         10,
		Window:              60 * time.Second,
		OpenTimeout:         30 * time.Second,
		HalfOpenProbes:      1,
		IsFailure:           isFailure,
		OnStateChange:       nil,
		Now:                 time.Now,
	}
}

// isFailure is the default Settings.IsFailure, as its "Default:" line
// states. Context errors from the caller's own ctx and a dependency's
// request to wait are excluded by Do before IsFailure is consulted; a
// context.DeadlineExceeded from a deadline of the dependency's client (while
// the caller's ctx is still live) is a failure.
func isFailure(err error) bool {
	return err != nil && !handler.IsPermanent(err) && !errors.Is(err, errOpen)
}

// errInvalidSettings prefixes every error Settings.Validate, NewSet,
// Set.Configure, Limits.Validate, Set.SetLimits and Set.SetShare return for
// bad Settings, Limits or share. Each problem names the field, its value
// and the rule it breaks, e.g. "breaker: invalid settings:
// Settings.FailureRatio = 1.5: must be in [0,1]".
var errInvalidSettings = errors.New("breaker: invalid settings")

// Validate reports every problem with s at once (errors.Join), each naming
// the field, its value and the rule, or nil. Zero fields are valid (they take their
// defaults).
func (s Settings) Validate() error {
	l := configerr.New(errInvalidSettings, "Settings.")
	if math.IsNaN(s.FailureRatio) || s.FailureRatio < 0 || s.FailureRatio > 1 {
		l.Bad("FailureRatio", s.FailureRatio, "must be in [0,1]")
	}
	l.NonNegative(map[string]time.Duration{"Window": s.Window, "OpenTimeout": s.OpenTimeout})
	return l.Err()
}

// withDefaults returns s with every zero field taken from d.
func (s Settings) withDefaults(d Settings) Settings {
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = d.ConsecutiveFailures
	}
	if s.FailureRatio == 0 {
		s.FailureRatio = d.FailureRatio
	}
	if s.MinRequests == 0 {
		s.MinRequests = d.MinRequests
	}
	if s.Window == 0 {
		s.Window = d.Window
	}
	if s.OpenTimeout == 0 {
		s.OpenTimeout = d.OpenTimeout
	}
	if s.HalfOpenProbes == 0 {
		s.HalfOpenProbes = d.HalfOpenProbes
	}
	if s.IsFailure == nil {
		s.IsFailure = d.IsFailure
	}
	if s.OnStateChange == nil {
		s.OnStateChange = d.OnStateChange
	}
	if s.Now == nil {
		s.Now = d.Now
	}
	return s
}

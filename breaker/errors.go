package breaker

import (
	"errors"
	"fmt"
	"time"
)

// ErrOpen is matched (errors.Is) by the *OpenError that Breaker.Do and Set.Do
// return when they reject a call without running it.
var ErrOpen = errors.New("breaker: open")

// ErrInUse is returned (wrapped) by Set.Configure when the named breaker has
// already been created by Get or Do.
var ErrInUse = errors.New("breaker: already in use")

// OpenError is returned by Breaker.Do and Set.Do when the breaker rejects the
// call; the call's function was not run. errors.Is(err, ErrOpen) holds.
//
// A consumer treats it as "dependency down", not as a failed message: it rolls
// back, spends no retry budget and pauses for RetryAfter before trying again.
type OpenError struct {
	// Name is the breaker's name (the dependency).
	Name string
	// State is Open (cooling down) or HalfOpen (cool-down over, but every
	// probe slot is taken by calls still running or already succeeded).
	State State
	// RetryAfter is when trying again makes sense. When Open it is the time
	// left of the cool-down (> 0, at most OpenTimeout): after it the breaker
	// is half-open and the next call is a probe. When HalfOpen it is
	// min(OpenTimeout, 1s): by then the probes have usually decided.
	RetryAfter time.Duration
	// Cause is the failure that opened the breaker when this call's own
	// failure did (its state is then Open and RetryAfter the full cool-down);
	// nil when the call was rejected without running.
	Cause error
}

// Unwrap returns Cause.
func (e *OpenError) Unwrap() error { return e.Cause }

// Error describes the failure in one line.
func (e *OpenError) Error() string {
	if e.State == HalfOpen {
		return fmt.Sprintf("breaker %q is half-open and its probe slots are taken: retry after %s", e.Name, e.RetryAfter)
	}
	if e.Cause != nil {
		return fmt.Sprintf("breaker %q opened by this failure: %v: retry after %s", e.Name, e.Cause, e.RetryAfter)
	}
	return fmt.Sprintf("breaker %q is %s: retry after %s", e.Name, e.State, e.RetryAfter)
}

// Is reports whether target is ErrOpen.
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// IsOpen reports whether err is or wraps an *OpenError (or ErrOpen): the
// breaker is open now, either because it rejected the call (Rejected) or because
// this call's failure opened it (OpenError.Cause). Either way, the caller should
// pause for RetryAfter rather than retry.
func IsOpen(err error) bool { return errors.Is(err, ErrOpen) }

// Rejected reports whether err is or wraps an *OpenError without a Cause: the
// call was refused by an open (or busy half-open) breaker and fn never ran.
func Rejected(err error) bool {
	var oe *OpenError
	return errors.As(err, &oe) && oe.Cause == nil
}

// RetryAfter returns the RetryAfter of the first *OpenError in err's chain,
// and whether there is one. It is never negative.
func RetryAfter(err error) (time.Duration, bool) {
	var oe *OpenError
	if !errors.As(err, &oe) {
		return 0, false
	}
	return max(oe.RetryAfter, 0), true
}

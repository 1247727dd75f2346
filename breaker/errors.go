package breaker

import (
	"errors"
	"fmt"
	"time"
)

// errOpen is matched (errors.Is) by the *OpenError that Set.Do returns when
// it rejects a call without running it.
var errOpen = errors.New("breaker: open")

// errInUse is returned (wrapped) by Set.Configure when the named breaker has
// already been created by Do.
var errInUse = errors.New("breaker: already in use")

// OpenError is returned by Set.Do when the breaker rejects the
// call; the call's function was not run. IsOpen holds for it.
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

// Is reports whether target is errOpen.
func (e *OpenError) Is(target error) bool { return target == errOpen }

// errThrottled is matched (errors.Is) by the *ThrottleError that Set.Do
// returns when a dependency is throttled: it asked callers to wait
// (Retry-After), or this consumer's share of its rate or of its calls in flight
// is used up. A *ThrottleError matches errOpen too, so IsOpen holds for it.
var errThrottled = errors.New("breaker: throttled")

// ThrottleReason says why a call was throttled.
type ThrottleReason string

// The reasons of a *ThrottleError. Their values suit a metric label.
const (
	// ReasonRetryAfter: the dependency answered with a Retry-After (an HTTP
	// 429, or a 503 with Retry-After), returned from inside Do as a
	// handler.RetryAfter error, and every call to it is paused until then.
	ReasonRetryAfter ThrottleReason = "retry-after"
	// ReasonRate: no token of the dependency's rate (Limits.Rate) would be
	// free within Limits.MaxWait.
	ReasonRate ThrottleReason = "rate"
	// ReasonInFlight: no call slot (Limits.MaxInFlight) came free within
	// Limits.MaxWait.
	ReasonInFlight ThrottleReason = "in-flight"
)

// ThrottleError is returned by Set.Do when a call to a
// dependency must wait longer than the caller should block: the dependency
// asked for a pause (ReasonRetryAfter), or a limit of Set.SetLimits would make
// the call wait longer than Limits.MaxWait (ReasonRate, ReasonInFlight).
// IsThrottled and IsOpen hold for it, so IsOpen,
// Rejected and RetryAfter treat it like an open breaker: a consumer rolls
// back, spends no retry budget, sends nothing to a retry or dead-letter topic,
// and pauses for RetryAfter. It is never counted as a failure by any breaker.
type ThrottleError struct {
	// Name is the dependency's name.
	Name string
	// Reason says which limit or answer throttled the call.
	Reason ThrottleReason
	// RetryAfter is when trying again makes sense: for ReasonRetryAfter the
	// time left of the dependency's pause; for ReasonRate the wait the rate
	// limiter computed for this call's token; for ReasonInFlight
	// Limits.MaxWait (how long this call already waited for a slot).
	RetryAfter time.Duration
	// Cause is the dependency's answer that started the pause when this
	// call's own fn returned it (Reason is then ReasonRetryAfter); nil when
	// the call was refused without running fn.
	Cause error
}

// Unwrap returns Cause.
func (e *ThrottleError) Unwrap() error { return e.Cause }

// Error describes the failure in one line.
func (e *ThrottleError) Error() string {
	switch {
	case e.Cause != nil:
		return fmt.Sprintf("dependency %q asked to wait: %v: paused for %s", e.Name, e.Cause, e.RetryAfter)
	case e.Reason == ReasonRetryAfter:
		return fmt.Sprintf("dependency %q is paused at its request: retry after %s", e.Name, e.RetryAfter)
	case e.Reason == ReasonRate:
		return fmt.Sprintf("dependency %q is over its rate limit: retry after %s", e.Name, e.RetryAfter)
	default:
		return fmt.Sprintf("dependency %q has no free call slot (%s): retry after %s", e.Name, e.Reason, e.RetryAfter)
	}
}

// Is reports whether target is errThrottled or errOpen.
func (e *ThrottleError) Is(target error) bool { return target == errThrottled || target == errOpen }

// pause is implemented by *OpenError and *ThrottleError: the errors that ask
// the caller to pause.
type pause interface {
	error
	pauseFor() time.Duration
	rejected() bool
}

func (e *OpenError) pauseFor() time.Duration     { return e.RetryAfter }
func (e *OpenError) rejected() bool              { return e.Cause == nil }
func (e *ThrottleError) pauseFor() time.Duration { return e.RetryAfter }
func (e *ThrottleError) rejected() bool          { return e.Cause == nil }

// IsOpen reports whether err is or wraps an *OpenError or a *ThrottleError:
// the dependency cannot be called now, because its breaker is open
// (it rejected the call, Rejected, or this call's failure opened it,
// OpenError.Cause) or because it is throttled (it asked for a pause, or a limit
// would make the call wait too long). Either way the caller should pause for
// RetryAfter rather than retry.
func IsOpen(err error) bool { return errors.Is(err, errOpen) }

// IsThrottled reports whether err is or wraps a *ThrottleError:
// the subset of IsOpen where the dependency is up but asked callers to wait, or
// a limit is used up, rather than a breaker being open.
func IsThrottled(err error) bool { return errors.Is(err, errThrottled) }

// Rejected reports whether err is or wraps an *OpenError or *ThrottleError
// without a Cause: the call was refused (open or busy half-open breaker, a
// pause, a limit) and fn never ran.
func Rejected(err error) bool {
	var p pause
	return errors.As(err, &p) && p.rejected()
}

// RetryAfter returns the RetryAfter of the first *OpenError or *ThrottleError
// in err's chain, and whether there is one. It is never negative.
func RetryAfter(err error) (time.Duration, bool) {
	var p pause
	if !errors.As(err, &p) {
		return 0, false
	}
	return max(p.pauseFor(), 0), true
}

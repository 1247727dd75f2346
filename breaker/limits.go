package breaker

import (
	"math"
	"time"

	"github.com/idemhq/idem/internal/configerr"
)

// Limits are the flow limits of one dependency of a Set (Set.SetLimits): a
// rate of calls (a token bucket, golang.org/x/time/rate) and a cap on the
// calls in flight. They are the budget of the whole consumer group: each
// member enforces its share of them (Set.SetShare).
//
// Waiting for a token or a slot is not an attempt: the breaker does not count
// it, and fn has not run. Do waits at most MaxWait for both together; when
// the wait would be longer it returns a *ThrottleError instead (see Set.Do).
//
// Unlike Settings, the zero Limits is not valid: a dependency with no limit
// needs no Limits. A limit of 0 calls is never meant, so Rate and MaxInFlight
// cannot both be 0.
type Limits struct {
	// Rate is how many calls a second the dependency accepts from the whole
	// group. Each member refills its token bucket at Rate × its share (see
	// Set.SetShare). 0 means no rate limit (MaxInFlight must then be set).
	// Must be finite and >= 0.
	// Default: 0 (no rate limit)
	Rate float64

	// Burst is the size of the group's token bucket: how many calls may start
	// at once after a quiet spell, on top of Rate. Each member's bucket holds
	// Burst × its share, rounded down, and at least 1. In any window of t
	// seconds one member starts at most Rate × share × t + its burst calls.
	// Must be >= 0, and 0 when Rate is 0.
	// Default: 1
	Burst int

	// MaxInFlight caps the calls to the dependency running at once in the
	// whole group. Each member allows MaxInFlight × its share, rounded down,
	// and at least 1 (so with more members than MaxInFlight the group may run
	// one call per member). A call holds its slot while fn runs. 0 means no
	// cap (Rate must then be set). Must be >= 0.
	// Default: 0 (no cap)
	MaxInFlight int

	// MaxWait is the longest one Do waits, for a token and a slot together,
	// before it gives up and returns a *ThrottleError (ReasonRate or
	// ReasonInFlight) without calling fn. A deadline of the caller's ctx that
	// comes sooner shortens it. Keep it well under the handler's timeout: a
	// consumer's handler waits inside its transaction and its lane. To never
	// wait, set 1ns. Must be >= 0.
	// Default: 1s
	MaxWait time.Duration
}

// defaultLimits returns the defaults that zero fields of Limits take. It is
// the one place they are defined. (Rate and MaxInFlight are 0 here: the
// defaults themselves set no limit.)
func defaultLimits() Limits {
	return Limits{
		Rate:        0,
		Burst:       1,
		MaxInFlight: 0,
		MaxWait:     time.Second,
	}
}

// Validate reports every problem with l at once (errors.Join), each
// naming the field ("Limits.Rate"), its value and the rule, or nil.
func (l Limits) Validate() error {
	errs := configerr.New(errInvalidSettings, "Limits.")
	rateOK := !math.IsNaN(l.Rate) && !math.IsInf(l.Rate, 0) && l.Rate >= 0
	if !rateOK {
		errs.Bad("Rate", l.Rate, "must be a finite number of calls per second >= 0 (0: no rate limit)")
	}
	if l.Burst < 0 {
		errs.Bad("Burst", l.Burst, "must be >= 0 (0 means the default, 1)")
	}
	if l.Burst > 0 && l.Rate == 0 {
		errs.Bad("Burst", l.Burst, "needs a Rate: a burst without a rate limits nothing")
	}
	if l.MaxInFlight < 0 {
		errs.Bad("MaxInFlight", l.MaxInFlight, "must be >= 0 (0: no cap)")
	}
	if l.MaxWait < 0 {
		errs.Bad("MaxWait", l.MaxWait, "must be >= 0 (0 means the default)")
	}
	if l.Rate == 0 && l.MaxInFlight == 0 {
		errs.Bad("Rate", l.Rate, "and MaxInFlight are both 0: a limit of 0 calls would stop the dependency; set at least one of them (a dependency without limits needs no SetLimits)")
	}
	return errs.Err()
}

// withDefaults returns l with every zero field that has a default taken from
// defaultLimits. Burst keeps 0 when there is no Rate.
func (l Limits) withDefaults() Limits {
	d := defaultLimits()
	if l.Burst == 0 && l.Rate > 0 {
		l.Burst = d.Burst
	}
	if l.MaxWait == 0 {
		l.MaxWait = d.MaxWait
	}
	return l
}

// scaled returns the limits of one member whose share of the group's budget
// is share (in (0,1]).
func (l Limits) scaled(share float64) Limits {
	part := func(n int) int {
		if n == 0 {
			return 0
		}
		// The epsilon keeps 9 × (1/3) at 3 despite rounding.
		return max(1, int(math.Floor(float64(n)*share+1e-9)))
	}
	l.Rate *= share
	l.Burst = part(l.Burst)
	l.MaxInFlight = part(l.MaxInFlight)
	return l
}

// LimitState is a snapshot of one dependency's flow control in this member,
// as reported by Set.LimitStates for gauges and counters.
type LimitState struct {
	// Rate is this member's current rate in calls a second (Limits.Rate ×
	// share); 0 when the dependency has no rate limit.
	Rate float64
	// Burst is this member's current bucket size; 0 without a rate limit.
	Burst int
	// MaxInFlight is this member's current cap of calls in flight; 0 when
	// there is none.
	MaxInFlight int
	// InFlight is how many calls are running fn now, through Set.Do.
	InFlight int
	// Waited is the total time Set.Do calls spent waiting for a token or a
	// slot, summed over calls (two calls waiting 1s each add 2s). A counter.
	Waited time.Duration
	// Paused is the total time the dependency was paused by its Retry-After
	// answers, up to now. A counter.
	Paused time.Duration
	// PauseLeft is the time left of the current Retry-After pause; 0 if none.
	PauseLeft time.Duration
	// Throttled counts the Set.Do calls that returned this dependency's
	// *ThrottleError, by reason (the call whose answer started a pause
	// included). Counters.
	Throttled map[ThrottleReason]uint64
}

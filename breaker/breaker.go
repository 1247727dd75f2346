package breaker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemhq/idem/handler"
)

// halfOpenRetryAfter caps OpenError.RetryAfter when a half-open breaker has
// no probe slot left.
const halfOpenRetryAfter = time.Second

// outcome is how a finished call is counted.
type outcome int

const (
	success  outcome = iota
	failure          // counted against the dependency
	excluded         // not counted at all
)

type transition struct{ from, to State }

// circuit is the circuit breaker of one dependency, as a Set keeps one per
// name: the state machine Set.Do documents. It is safe for concurrent use;
// the zero circuit is not usable.
type circuit struct {
	name string
	s    Settings // defaults applied

	mu    sync.Mutex
	state State
	// gen is bumped on every state change; a call admitted in an earlier
	// generation has its outcome ignored (as in gobreaker).
	gen uint64

	// Closed.
	consecutive uint32    // consecutive failures
	successes   uint32    // counted successes in the current window
	failures    uint32    // counted failures in the current window
	windowEnd   time.Time // when successes and failures are cleared

	// Open.
	openUntil time.Time // end of the cool-down

	// HalfOpen.
	probes    uint32 // probe slots taken: admitted minus those not counted
	probeWins uint32 // probes that succeeded

	// The pause a Retry-After answer asked for, whatever the state.
	pauseStart  time.Time     // when the current (or last) pause began
	pauseUntil  time.Time     // when it ends; zero if there never was one
	pausedEarly time.Duration // total length of the pauses before the current one

	// OnStateChange delivery: transitions queue here and are delivered, in
	// order, by one goroutine at a time, without mu held.
	pending    []transition
	delivering bool
}

// newBreaker returns a closed breaker whose announcement (Closed → Closed)
// is queued for OnStateChange; the caller delivers it.
func newBreaker(name string, s Settings) *circuit {
	b := &circuit{name: name, s: s}
	b.windowEnd = s.Now().Add(s.Window)
	if s.OnStateChange != nil {
		b.pending = append(b.pending, transition{Closed, Closed})
	}
	return b
}

// State returns the current state. Reading it may notice that the cool-down
// is over and move the breaker from open to half-open.
func (b *circuit) State() State {
	b.mu.Lock()
	b.advance(b.s.Now())
	st := b.state
	b.mu.Unlock()
	b.deliver()
	return st
}

// Do runs fn(ctx) if the breaker lets the call through and returns its
// error, or returns an *OpenError or *ThrottleError without running fn: the
// breaker's part of Set.Do, whose doc gives the exact semantics. If ctx is
// already done, Do returns ctx.Err() without running fn or taking a probe
// slot; nothing is counted.
func (b *circuit) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	gen, err := b.allow(true)
	b.deliver()
	if err != nil {
		return err
	}
	finished := false
	defer func() {
		if !finished { // fn panicked or called runtime.Goexit
			b.record(gen, failure)
			b.deliver()
		}
	}()
	err = fn(ctx)
	finished = true
	opened := b.record(gen, b.classify(ctx, err))
	b.deliver()
	if d, ok := b.throttleAnswer(err); ok {
		return &ThrottleError{Name: b.name, Reason: ReasonRetryAfter, RetryAfter: b.startPause(d), Cause: err}
	}
	if opened {
		// This failure opened the breaker: report it as an open breaker that
		// carries the failure, so a consumer pauses instead of spending a
		// retry on a dependency that is now known to be down.
		return &OpenError{Name: b.name, State: Open, RetryAfter: b.s.OpenTimeout, Cause: err}
	}
	return err
}

func (b *circuit) classify(ctx context.Context, err error) outcome {
	switch {
	case err == nil:
		return success
	case ctx.Err() != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)):
		return excluded // the caller gave up; the dependency did not fail
	case b.isThrottleAnswer(err):
		return excluded // the dependency answered: it asks us to wait, it is not down
	case b.s.IsFailure(err):
		return failure
	default:
		return excluded
	}
}

// throttleAnswer reports whether err is a dependency's request to wait (see
// Do), and for how long.
func (b *circuit) throttleAnswer(err error) (time.Duration, bool) {
	if err == nil || errors.Is(err, errOpen) || handler.IsPermanent(err) {
		return 0, false
	}
	after, ok := handler.RetryAfterOf(err)
	if !ok {
		return 0, false
	}
	if after <= 0 {
		return min(b.s.OpenTimeout, halfOpenRetryAfter), true
	}
	return after, true
}

func (b *circuit) isThrottleAnswer(err error) bool {
	_, ok := b.throttleAnswer(err)
	return ok
}

// startPause pauses every call for d from now, unless a running pause ends
// later, and returns the time left of the pause.
func (b *circuit) startPause(d time.Duration) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.s.Now()
	until := now.Add(d)
	if !now.Before(b.pauseUntil) { // no pause running: a new one starts
		b.pausedEarly += b.pauseUntil.Sub(b.pauseStart)
		b.pauseStart = now
	}
	if until.After(b.pauseUntil) {
		b.pauseUntil = until
	}
	return b.pauseUntil.Sub(now)
}

// paused returns the time left of the current Retry-After pause (0 if none)
// and the total time paused so far, the current pause up to now included.
func (b *circuit) paused() (left, total time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.s.Now()
	end := b.pauseUntil
	if now.Before(end) {
		left = end.Sub(now)
		end = now
	}
	return left, b.pausedEarly + max(end.Sub(b.pauseStart), 0)
}

// allow admits a call or returns an *OpenError or a *ThrottleError. When take
// is false it only checks: a half-open breaker's probe slot is not taken and
// the generation returned is meaningless.
func (b *circuit) allow(take bool) (uint64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.s.Now()
	b.advance(now)
	if b.state == Open {
		left := min(max(b.openUntil.Sub(now), 0), b.s.OpenTimeout)
		return 0, &OpenError{Name: b.name, State: Open, RetryAfter: left}
	}
	if now.Before(b.pauseUntil) {
		return 0, &ThrottleError{Name: b.name, Reason: ReasonRetryAfter, RetryAfter: b.pauseUntil.Sub(now)}
	}
	if b.state == HalfOpen {
		if b.probes >= b.s.HalfOpenProbes {
			return 0, &OpenError{Name: b.name, State: HalfOpen, RetryAfter: min(b.s.OpenTimeout, halfOpenRetryAfter)}
		}
		if take {
			b.probes++
		}
	}
	return b.gen, nil
}

// record counts the outcome of a call admitted in generation gen and reports
// whether it opened the breaker.
func (b *circuit) record(gen uint64, o outcome) (opened bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.s.Now()
	b.advance(now)
	if gen != b.gen {
		return false
	}
	switch b.state {
	case Closed:
		switch o {
		case success:
			b.consecutive = 0
			b.successes++
		case failure:
			b.consecutive++
			b.failures++
			if b.tripped() {
				b.setState(Open, now)
				return true
			}
		}
	case HalfOpen:
		switch o {
		case success:
			b.probeWins++
			if b.probeWins >= b.s.HalfOpenProbes {
				b.setState(Closed, now)
			}
		case failure:
			b.setState(Open, now)
			return true
		case excluded:
			b.probes--
		}
	}
	return false
}

// tripped reports whether the closed-state counts call for opening.
func (b *circuit) tripped() bool {
	if b.consecutive >= b.s.ConsecutiveFailures {
		return true
	}
	if b.s.FailureRatio <= 0 {
		return false
	}
	total := uint64(b.successes) + uint64(b.failures)
	return total >= uint64(b.s.MinRequests) && float64(b.failures)/float64(total) >= b.s.FailureRatio
}

// advance applies the transitions due by time: the end of a closed window and
// the end of the cool-down. mu must be held.
func (b *circuit) advance(now time.Time) {
	switch b.state {
	case Closed:
		if !now.Before(b.windowEnd) {
			b.successes, b.failures = 0, 0
			b.windowEnd = now.Add(b.s.Window)
		}
	case Open:
		if !now.Before(b.openUntil) {
			b.setState(HalfOpen, now)
		}
	}
}

// setState moves to state to, clearing the counts of the new state, and
// queues the OnStateChange call. mu must be held.
func (b *circuit) setState(to State, now time.Time) {
	from := b.state
	if from == to {
		return
	}
	b.state = to
	b.gen++
	switch to {
	case Closed:
		b.consecutive, b.successes, b.failures = 0, 0, 0
		b.windowEnd = now.Add(b.s.Window)
	case Open:
		b.openUntil = now.Add(b.s.OpenTimeout)
	case HalfOpen:
		b.probes, b.probeWins = 0, 0
	}
	if b.s.OnStateChange != nil {
		b.pending = append(b.pending, transition{from, to})
	}
}

// deliver calls OnStateChange for the queued transitions, in order, unless
// another goroutine is already delivering (it will pick them up).
func (b *circuit) deliver() {
	b.mu.Lock()
	if b.delivering || len(b.pending) == 0 {
		b.mu.Unlock()
		return
	}
	b.delivering = true
	for len(b.pending) > 0 {
		batch := b.pending
		b.pending = nil
		b.mu.Unlock()
		b.notify(batch)
		b.mu.Lock()
	}
	b.delivering = false
	b.mu.Unlock()
}

// notify calls OnStateChange for each transition of batch. If a call panics,
// the rest of batch is dropped and the panic continues; later transitions are
// still delivered.
func (b *circuit) notify(batch []transition) {
	done := false
	defer func() {
		if !done {
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	for _, t := range batch {
		b.s.OnStateChange(b.name, t.from, t.to)
	}
	done = true
}

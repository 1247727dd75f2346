package breaker

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// afterFunc starts a timer: the channel receives once d has passed; stop
// releases it. Tests replace the real one with a fake driven by their clock.
type afterFunc func(d time.Duration) (c <-chan time.Time, stop func() bool)

func realAfter(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// errNoSlot is slots.acquire's timeout; Set.Do turns it into a *ThrottleError.
var errNoSlot = errors.New("breaker: no call slot free")

// flow is the flow control of one dependency of a Set: its limits, its token
// bucket, its call slots and its counters.
type flow struct {
	name  string
	slots slots

	mu     sync.Mutex
	now    func() time.Time // the clock of the dependency's Settings
	limits *Limits          // the group's limits, defaults applied; nil: none
	cur    Limits           // this member's share of them
	lim    *rate.Limiter    // nil: no rate limit

	waited    time.Duration
	throttled map[ThrottleReason]uint64
}

// apply makes the member's limits limits × share. mu must be held.
func (f *flow) apply(share float64) {
	if f.limits == nil {
		return
	}
	f.cur = f.limits.scaled(share)
	switch {
	case f.cur.Rate == 0:
		f.lim = nil
	case f.lim == nil:
		f.lim = rate.NewLimiter(rate.Limit(f.cur.Rate), f.cur.Burst) // a full bucket
	default:
		// Tokens already earned are kept (up to the new burst); reservations
		// already made keep their times.
		now := f.now()
		f.lim.SetLimitAt(now, rate.Limit(f.cur.Rate))
		f.lim.SetBurstAt(now, f.cur.Burst)
	}
	f.slots.setMax(f.cur.MaxInFlight)
}

// acquire waits for a token and a slot, at most MaxWait (or until ctx's
// deadline, if sooner) in all. It returns the function that frees the slot,
// or ctx's error if ctx ended while waiting, or a *ThrottleError when the
// wait would be, or was, too long. Whatever it returns, nothing is counted by
// the breaker.
func (f *flow) acquire(ctx context.Context, after afterFunc) (release func(), err error) {
	f.mu.Lock()
	lim, maxWait, now := f.lim, f.cur.MaxWait, f.now
	f.mu.Unlock()
	start := now()
	budget := maxWait
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, dl.Sub(start))
	}
	defer func() { f.addWait(now().Sub(start)) }()
	if lim != nil {
		r := lim.ReserveN(start, 1)
		wait := r.DelayFrom(start)
		if !r.OK() || wait > budget {
			r.CancelAt(start) // give the token back to the calls that can wait for it
			return nil, &ThrottleError{Name: f.name, Reason: ReasonRate, RetryAfter: wait}
		}
		if wait > 0 {
			if err := sleep(ctx, after, wait); err != nil {
				r.CancelAt(now())
				return nil, err
			}
		}
	}
	err = f.slots.acquire(ctx, budget-now().Sub(start), after)
	switch {
	case errors.Is(err, errNoSlot):
		return nil, &ThrottleError{Name: f.name, Reason: ReasonInFlight, RetryAfter: maxWait}
	case err != nil:
		return nil, err
	}
	return f.slots.release, nil
}

func (f *flow) addWait(d time.Duration) {
	if d <= 0 {
		return
	}
	f.mu.Lock()
	f.waited += d
	f.mu.Unlock()
}

// count notes a *ThrottleError of this dependency returned by Set.Do.
func (f *flow) count(err error) {
	var te *ThrottleError
	if !errors.As(err, &te) || te.Name != f.name {
		return
	}
	f.mu.Lock()
	if f.throttled == nil {
		f.throttled = make(map[ThrottleReason]uint64)
	}
	f.throttled[te.Reason]++
	f.mu.Unlock()
}

// state returns the snapshot, less the pause (kept by the breaker).
func (f *flow) state() LimitState {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := LimitState{
		Rate:        f.cur.Rate,
		Burst:       f.cur.Burst,
		MaxInFlight: f.cur.MaxInFlight,
		InFlight:    f.slots.inUse(),
		Waited:      f.waited,
		Throttled:   make(map[ThrottleReason]uint64, len(f.throttled)),
	}
	for r, n := range f.throttled {
		st.Throttled[r] = n
	}
	return st
}

// sleep waits d, or until ctx is done (then it returns ctx's error).
func sleep(ctx context.Context, after afterFunc, d time.Duration) error {
	c, stop := after(d)
	defer stop()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// slots counts the calls in flight and caps them; waiters are served in
// arrival order. The zero value has no cap.
type slots struct {
	mu      sync.Mutex
	max     int // 0: no cap
	used    int
	waiters []chan struct{} // closed when the waiter is given a slot
}

func (s *slots) free() bool { return s.max == 0 || s.used < s.max }

// acquire takes a slot, waiting at most wait for one behind earlier waiters.
// It returns errNoSlot on timeout, or ctx's error if ctx ended first.
func (s *slots) acquire(ctx context.Context, wait time.Duration, after afterFunc) error {
	s.mu.Lock()
	if len(s.waiters) == 0 && s.free() {
		s.used++
		s.mu.Unlock()
		return nil
	}
	if wait <= 0 {
		s.mu.Unlock()
		return errNoSlot
	}
	w := make(chan struct{})
	s.waiters = append(s.waiters, w)
	s.mu.Unlock()

	c, stop := after(wait)
	defer stop()
	var err error
	select {
	case <-w:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-c:
		err = errNoSlot
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-w: // given a slot as we gave up
		if err == errNoSlot {
			return nil // it came in time after all
		}
		s.used--
		s.grant()
	default:
		for i, x := range s.waiters {
			if x == w {
				s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
				break
			}
		}
	}
	return err
}

func (s *slots) release() {
	s.mu.Lock()
	s.used--
	s.grant()
	s.mu.Unlock()
}

// grant hands free slots to the waiters, first come first served. mu must be
// held.
func (s *slots) grant() {
	for len(s.waiters) > 0 && s.free() {
		s.used++
		close(s.waiters[0])
		s.waiters = s.waiters[1:]
	}
}

func (s *slots) setMax(n int) {
	s.mu.Lock()
	s.max = n
	s.grant()
	s.mu.Unlock()
}

func (s *slots) inUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
)

// fakeClock is a manual clock for Settings.Now, with timers (After) that
// Advance fires.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at time.Time
	c  chan time.Time
}

func newClock() *fakeClock {
	return &fakeClock{t: time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d and fires the timers that are then due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	keep := c.timers[:0]
	for _, t := range c.timers {
		if t.at.After(c.t) {
			keep = append(keep, t)
			continue
		}
		t.c <- c.t
	}
	c.timers = keep
}

// After is a timer on the fake clock, for breaker.SetAfter.
func (c *fakeClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.t.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- c.t
		return t.c, func() bool { return false }
	}
	c.timers = append(c.timers, t)
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.timers {
			if x == t {
				c.timers = append(c.timers[:i], c.timers[i+1:]...)
				return true
			}
		}
		return false
	}
}

// advanceToNext moves the clock to the earliest pending timer and fires it
// (and any due at the same time).
func (c *fakeClock) advanceToNext(tb testing.TB) {
	tb.Helper()
	c.mu.Lock()
	if len(c.timers) == 0 {
		c.mu.Unlock()
		tb.Fatal("no timer pending")
	}
	next := c.timers[0].at
	for _, t := range c.timers {
		if t.at.Before(next) {
			next = t.at
		}
	}
	d := next.Sub(c.t)
	c.mu.Unlock()
	c.Advance(d)
}

// pending returns how many timers are pending.
func (c *fakeClock) pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// waitTimers waits until n timers are pending on c: n calls are waiting.
func (c *fakeClock) waitTimers(tb testing.TB, n int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := c.pending()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d timers pending, want %d", got, n)
		}
		time.Sleep(100 * time.Microsecond) // poll
	}
}

var errDown = errors.New("dependency down")

func ok(context.Context) error   { return nil }
func fail(context.Context) error { return errDown }

// recorder collects OnStateChange calls that are transitions (it skips a
// new breaker's announcement, from == to; see TestNewBreakerIsAnnounced).
type recorder struct {
	mu sync.Mutex
	ts []string
}

func (r *recorder) hook(name string, from, to breaker.State) {
	if from == to {
		return
	}
	r.mu.Lock()
	r.ts = append(r.ts, name+": "+from.String()+" -> "+to.String())
	r.mu.Unlock()
}

func (r *recorder) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.ts...)
}

// newBreaker returns a breaker on clock c with s's other fields.
func newBreaker(tb testing.TB, c *fakeClock, s breaker.Settings) *breaker.Breaker {
	tb.Helper()
	s.Now = c.Now
	b, err := breaker.New("dep", s)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return b
}

// do calls b.Do n times with fn, failing the test on an unexpected rejection.
func do(tb testing.TB, b *breaker.Breaker, n int, fn func(context.Context) error) {
	tb.Helper()
	for i := 0; i < n; i++ {
		if err := b.Do(context.Background(), fn); breaker.Rejected(err) {
			tb.Fatalf("call %d of %d rejected: %v", i+1, n, err)
		}
	}
}

func wantState(tb testing.TB, b *breaker.Breaker, want breaker.State) {
	tb.Helper()
	if got := b.State(); got != want {
		tb.Fatalf("state = %s, want %s", got, want)
	}
}

// tripOpen opens b by failing it ConsecutiveFailures times.
func tripOpen(tb testing.TB, b *breaker.Breaker, n int) {
	tb.Helper()
	do(tb, b, n, fail)
	wantState(tb, b, breaker.Open)
}

// wantOpenError asserts err is an *OpenError with state and retry-after.
func wantOpenError(tb testing.TB, err error, state breaker.State, retry time.Duration) {
	tb.Helper()
	var oe *breaker.OpenError
	if !errors.As(err, &oe) {
		tb.Fatalf("err = %v, want *OpenError", err)
	}
	if !errors.Is(err, breaker.ErrOpen) {
		tb.Fatalf("errors.Is(%v, ErrOpen) = false", err)
	}
	if oe.State != state || oe.RetryAfter != retry {
		tb.Fatalf("OpenError{State: %s, RetryAfter: %s}, want {%s, %s}", oe.State, oe.RetryAfter, state, retry)
	}
}

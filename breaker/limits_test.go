package breaker_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/internal/configerr"
)

// newLimitedSet returns a Set on clock c, whose waits end when c advances,
// with limits l for "bank". Every counted failure opens its breakers
// (ConsecutiveFailures 1), so a test sees at once if waiting was counted.
func newLimitedSet(tb testing.TB, c *fakeClock, l breaker.Limits) *breaker.Set {
	tb.Helper()
	set := newSet(tb, c, breaker.Settings{ConsecutiveFailures: 1})
	breaker.SetAfter(set, c.After)
	if err := set.SetLimits("bank", l); err != nil {
		tb.Fatalf("SetLimits: %v", err)
	}
	return set
}

// async runs set.Do(ctx, "bank", fn) on its own goroutine; the channel
// receives its error.
func async(ctx context.Context, set *breaker.Set, fn func(context.Context) error) <-chan error {
	done := make(chan error, 1)
	go func() { done <- set.Do(ctx, "bank", fn) }()
	return done
}

// result waits (with a deadline) for the error of an async call.
func result(tb testing.TB, done <-chan error) error {
	tb.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		tb.Fatal("call still waiting after 10s")
		return nil
	}
}

// wantThrottle asserts err is a *ThrottleError of "bank" refused without
// running fn, for reason, with RetryAfter retry.
func wantThrottle(tb testing.TB, err error, reason breaker.ThrottleReason, retry time.Duration) {
	tb.Helper()
	var te *breaker.ThrottleError
	if !errors.As(err, &te) {
		tb.Fatalf("err = %v, want *ThrottleError", err)
	}
	if !breaker.IsOpen(err) || !breaker.IsThrottled(err) || !breaker.Rejected(err) {
		tb.Fatalf("IsOpen, IsThrottled, Rejected = %v, %v, %v for %v; want all true",
			breaker.IsOpen(err), breaker.IsThrottled(err), breaker.Rejected(err), err)
	}
	if d, _ := breaker.RetryAfter(err); te.Name != "bank" || te.Reason != reason || d != retry {
		tb.Fatalf("ThrottleError{Name: %q, Reason: %s, RetryAfter: %s}, want {bank, %s, %s}", te.Name, te.Reason, d, reason, retry)
	}
}

// wantClosed asserts that nothing was counted as a failure: with
// ConsecutiveFailures 1 a single one would have opened the breaker.
func wantClosed(tb testing.TB, set *breaker.Set) {
	tb.Helper()
	if st := set.States()["bank"]; st != breaker.Closed {
		tb.Fatalf("breaker %s, want closed: a wait or refusal was counted as a failure", st)
	}
}

// callsPerStep calls "bank" (never waiting) at every step of the clock for
// span, as often as the limit lets it, and returns when each call ran.
func callsPerStep(tb testing.TB, c *fakeClock, set *breaker.Set, step, span time.Duration) []time.Time {
	tb.Helper()
	var at []time.Time
	for end := c.Now().Add(span); c.Now().Before(end); c.Advance(step) {
		for {
			err := set.Do(context.Background(), "bank", ok)
			if err != nil {
				var te *breaker.ThrottleError
				if !errors.As(err, &te) || te.Reason != breaker.ReasonRate || te.RetryAfter <= 0 {
					tb.Fatalf("refusal %v, want a ReasonRate *ThrottleError with a RetryAfter", err)
				}
				break
			}
			at = append(at, c.Now())
			if len(at) > 1e6 {
				tb.Fatal("no rate limit")
			}
		}
	}
	return at
}

// maxInWindow returns the most calls of at (sorted) in any window of length w.
func maxInWindow(at []time.Time, w time.Duration) int {
	best, lo := 0, 0
	for hi := range at {
		for at[hi].Sub(at[lo]) >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

func TestRateBoundHolds(t *testing.T) {
	c := newClock()
	// MaxWait 1ns: a call that would wait is refused at once, so one
	// goroutine can count the calls the bucket lets through.
	set := newLimitedSet(t, c, breaker.Limits{Rate: 50, Burst: 5, MaxWait: time.Nanosecond})
	at := callsPerStep(t, c, set, time.Millisecond, 10*time.Second)
	if got, limit := maxInWindow(at, time.Second), 50+5; got > limit {
		t.Fatalf("%d calls in one 1s window, want <= rate + burst = %d", got, limit)
	}
	// The limit is a bound, not a stall: 10s at 50/s plus the first burst.
	if got := len(at); got < 500 || got > 505 {
		t.Fatalf("%d calls in 10s, want 500..505", got)
	}
	wantClosed(t, set)
	st := set.LimitStates()["bank"]
	if st.Rate != 50 || st.Burst != 5 || st.Waited != 0 || st.Throttled[breaker.ReasonRate] == 0 {
		t.Fatalf("LimitStates = %+v, want rate 50, burst 5, no wait, refusals counted", st)
	}
}

func TestWaitForTokenIsNotAnAttempt(t *testing.T) {
	c := newClock()
	set := newLimitedSet(t, c, breaker.Limits{Rate: 10, MaxWait: 150 * time.Millisecond}) // a token every 100ms, burst 1
	ctx := context.Background()
	if err := set.Do(ctx, "bank", ok); err != nil { // the bucket's one token
		t.Fatal(err)
	}
	var called atomic.Int32
	count := func(context.Context) error { called.Add(1); return nil }

	second := async(ctx, set, count) // its token is due in 100ms: it waits
	c.waitTimers(t, 1)
	// A third call's token would be due in 200ms, past MaxWait: refused at
	// once, with the wait it would have needed, and its token given back.
	wantThrottle(t, set.Do(ctx, "bank", count), breaker.ReasonRate, 200*time.Millisecond)
	if n := called.Load(); n != 0 {
		t.Fatalf("fn called %d times before any token was due", n)
	}
	c.Advance(100 * time.Millisecond)
	if err := result(t, second); err != nil {
		t.Fatalf("waiting call: %v", err)
	}
	// Had the refused call kept its token, this one would wait 200ms.
	fourth := async(ctx, set, count)
	c.waitTimers(t, 1)
	c.Advance(100 * time.Millisecond)
	if err := result(t, fourth); err != nil {
		t.Fatalf("fourth call: %v", err)
	}
	if n := called.Load(); n != 2 {
		t.Fatalf("fn called %d times, want 2", n)
	}
	wantClosed(t, set)
	st := set.LimitStates()["bank"]
	if st.Waited != 200*time.Millisecond || st.Throttled[breaker.ReasonRate] != 1 || st.InFlight != 0 {
		t.Fatalf("LimitStates = %+v, want 200ms waited, 1 refusal, none in flight", st)
	}
}

func TestWaitHonoursContext(t *testing.T) {
	c := newClock()
	set := newLimitedSet(t, c, breaker.Limits{Rate: 10})
	if err := set.Do(context.Background(), "bank", ok); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	waiting := async(ctx, set, func(context.Context) error {
		t.Error("fn ran for a call whose ctx ended while it waited")
		return nil
	})
	c.waitTimers(t, 1)
	cancel()
	err := result(t, waiting)
	if !errors.Is(err, context.Canceled) || breaker.IsOpen(err) {
		t.Fatalf("err = %v, want context.Canceled, not a pause", err)
	}
	wantClosed(t, set)
	// The cancelled call gave its token back: the next waits 100ms, not 200ms.
	next := async(context.Background(), set, ok)
	c.waitTimers(t, 1)
	c.Advance(100 * time.Millisecond)
	if err := result(t, next); err != nil {
		t.Fatal(err)
	}

	// A caller whose ctx ends before the token is due is refused at once
	// rather than left to wait and time out (which would cost it a retry).
	// The real clock, but nothing waits: a token an hour, MaxWait 2h.
	real, err := breaker.NewSet(breaker.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := real.SetLimits("bank", breaker.Limits{Rate: 1.0 / 3600, MaxWait: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := real.Do(context.Background(), "bank", ok); err != nil {
		t.Fatal(err)
	}
	dl, cancelDL := context.WithTimeout(context.Background(), time.Minute)
	defer cancelDL()
	err = real.Do(dl, "bank", ok)
	var te *breaker.ThrottleError
	if !errors.As(err, &te) || te.Reason != breaker.ReasonRate || te.RetryAfter < 59*time.Minute {
		t.Fatalf("err = %v, want a ReasonRate *ThrottleError with RetryAfter about 1h", err)
	}
}

func TestMaxInFlight(t *testing.T) {
	c := newClock()
	set := newLimitedSet(t, c, breaker.Limits{MaxInFlight: 2, MaxWait: time.Second})
	ctx := context.Background()
	entered := make(chan string, 8)
	// blocking returns an fn that reports it runs, then returns when release
	// is closed.
	blocking := func(name string, release <-chan struct{}) func(context.Context) error {
		return func(context.Context) error {
			entered <- name
			<-release
			return nil
		}
	}
	releaseFirst, releaseRest := make(chan struct{}), make(chan struct{})
	first := async(ctx, set, blocking("first", releaseFirst))
	<-entered
	second := async(ctx, set, blocking("second", releaseRest))
	<-entered
	if st := set.LimitStates()["bank"]; st.InFlight != 2 || st.MaxInFlight != 2 {
		t.Fatalf("LimitStates = %+v, want 2 of 2 in flight", st)
	}
	third := async(ctx, set, blocking("third", releaseRest)) // waits for a slot
	c.waitTimers(t, 1)
	select {
	case name := <-entered:
		t.Fatalf("%s ran with 2 calls in flight and MaxInFlight 2", name)
	default:
	}
	c.Advance(400 * time.Millisecond)
	close(releaseFirst) // the first returns; the third takes its slot
	if err := result(t, first); err != nil {
		t.Fatal(err)
	}
	if name := <-entered; name != "third" {
		t.Fatalf("%s entered, want third", name)
	}
	// Two in flight again: a fourth waits MaxWait, then is refused.
	fourth := async(ctx, set, blocking("fourth", releaseRest))
	c.waitTimers(t, 1)
	c.Advance(time.Second)
	wantThrottle(t, result(t, fourth), breaker.ReasonInFlight, time.Second)
	// A call whose ctx ends while it waits leaves the queue, uncounted.
	cctx, cancel := context.WithCancel(ctx)
	fifth := async(cctx, set, blocking("fifth", releaseRest))
	c.waitTimers(t, 1)
	cancel()
	if err := result(t, fifth); !errors.Is(err, context.Canceled) || breaker.IsOpen(err) {
		t.Fatalf("fifth = %v, want context.Canceled", err)
	}
	close(releaseRest)
	for _, ch := range []<-chan error{second, third} {
		if err := result(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	wantClosed(t, set)
	st := set.LimitStates()["bank"]
	if st.InFlight != 0 || st.Waited != 1400*time.Millisecond || st.Throttled[breaker.ReasonInFlight] != 1 {
		t.Fatalf("LimitStates = %+v, want none in flight, 1.4s waited, 1 refusal", st)
	}
}

func TestSetShareRescales(t *testing.T) {
	c := newClock()
	set := newLimitedSet(t, c, breaker.Limits{Rate: 300, Burst: 30, MaxInFlight: 9, MaxWait: time.Nanosecond})
	want := func(name string, rate float64, burst, inFlight int) {
		t.Helper()
		st := set.LimitStates()[name]
		if math.Abs(st.Rate-rate) > 1e-9 || st.Burst != burst || st.MaxInFlight != inFlight {
			t.Fatalf("%s: LimitStates = %+v, want rate %v, burst %d, max in flight %d", name, st, rate, burst, inFlight)
		}
	}
	want("bank", 300, 30, 9)
	if err := set.SetShare(1.0 / 3); err != nil { // three members
		t.Fatal(err)
	}
	want("bank", 100, 10, 3)
	if err := set.SetLimits("ledger", breaker.Limits{Rate: 30}); err != nil { // later limits get the share too
		t.Fatal(err)
	}
	want("ledger", 10, 1, 0)

	// The new rate holds: at most 100/s + a burst of 10 in any second.
	c.Advance(time.Second) // refill
	at := callsPerStep(t, c, set, time.Millisecond, 5*time.Second)
	if got := maxInWindow(at, time.Second); got > 110 {
		t.Fatalf("%d calls in one 1s window after SetShare(1/3), want <= 110", got)
	}
	if got := len(at); got < 500 || got > 510 {
		t.Fatalf("%d calls in 5s, want 500..510", got)
	}

	for _, bad := range []float64{0, -0.5, 1.5, math.NaN()} {
		err := set.SetShare(bad)
		if err == nil || !strings.Contains(err.Error(), "breaker: invalid settings") {
			t.Errorf("SetShare(%v) = %v, want an invalid-settings error", bad, err)
		}
	}
	want("bank", 100, 10, 3) // unchanged by the bad calls

	// A member that gets a larger share lets waiting calls through at once.
	if err := set.SetLimits("bank", breaker.Limits{MaxInFlight: 2, MaxWait: time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := set.SetShare(0.5); err != nil {
		t.Fatal(err)
	}
	want("bank", 0, 0, 1)
	entered, release := make(chan struct{}, 2), make(chan struct{})
	blocking := func(context.Context) error { entered <- struct{}{}; <-release; return nil }
	first := async(context.Background(), set, blocking)
	<-entered
	second := async(context.Background(), set, blocking)
	c.waitTimers(t, 1)
	if err := set.SetShare(1); err != nil {
		t.Fatal(err)
	}
	<-entered
	close(release)
	for _, ch := range []<-chan error{first, second} {
		if err := result(t, ch); err != nil {
			t.Fatal(err)
		}
	}
}

func TestLimitsValidate(t *testing.T) {
	tests := []struct {
		name   string
		l      breaker.Limits
		fields []string // nil: valid
	}{
		{"rate", breaker.Limits{Rate: 200}, nil},
		{"in flight", breaker.Limits{MaxInFlight: 4}, nil},
		{"everything", breaker.Limits{Rate: 0.5, Burst: 3, MaxInFlight: 1, MaxWait: time.Millisecond}, nil},
		{"zero: a limit of 0", breaker.Limits{}, []string{"Rate"}},
		{"only MaxWait", breaker.Limits{MaxWait: time.Second}, []string{"Rate"}},
		{"negative rate", breaker.Limits{Rate: -1, MaxInFlight: 1}, []string{"Rate"}},
		{"NaN rate", breaker.Limits{Rate: math.NaN()}, []string{"Rate"}},
		{"infinite rate", breaker.Limits{Rate: math.Inf(1)}, []string{"Rate"}},
		{"burst without rate", breaker.Limits{Burst: 5, MaxInFlight: 1}, []string{"Burst"}},
		{"every field negative", breaker.Limits{Rate: -1, Burst: -2, MaxInFlight: -3, MaxWait: -time.Second},
			[]string{"Rate", "Burst", "MaxInFlight", "MaxWait"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.l.Validate()
			set := newSet(t, newClock(), breaker.Settings{})
			serr := set.SetLimits("bank", tt.l)
			if tt.fields == nil {
				if err != nil || serr != nil {
					t.Fatalf("Validate() = %v, SetLimits = %v; want nil", err, serr)
				}
				return
			}
			if (err == nil || !strings.Contains(err.Error(), "breaker: invalid settings")) || (serr == nil || !strings.Contains(serr.Error(), "breaker: invalid settings")) {
				t.Fatalf("Validate() = %v, SetLimits = %v; want an invalid-settings error", err, serr)
			}
			var got []string
			for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
				var se *configerr.Error
				field, ok := "", errors.As(e, &se)
				if ok {
					field, ok = strings.CutPrefix(se.Field, "Limits.")
				}
				if !ok {
					t.Fatalf("%v does not name a field of Limits", e)
				}
				got = append(got, field)
			}
			if strings.Join(got, ",") != strings.Join(tt.fields, ",") {
				t.Fatalf("Validate() reported %q, want every problem: %q\n%v", got, tt.fields, err)
			}
			if !strings.Contains(serr.Error(), `SetLimits("bank")`) {
				t.Fatalf("SetLimits error %q does not name the dependency", serr)
			}
			if _, ok := set.LimitStates()["bank"]; ok {
				t.Fatal("rejected limits were applied")
			}
		})
	}
	msg := breaker.Limits{Rate: -1, MaxWait: -time.Second}.Validate().Error()
	for _, want := range []string{"breaker: invalid settings: Limits.Rate = -1: must be", "breaker: invalid settings: Limits.MaxWait = -1s: must be >= 0"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Validate() = %q, want it to contain %q", msg, want)
		}
	}
}

// TestRateBoundHoldsForWaitingLanes runs 16 lanes that call "bank" one call
// after another, each call waiting for its token, and checks the times fn ran
// at against the rate: the path a consumer's lanes take.
func TestRateBoundHoldsForWaitingLanes(t *testing.T) {
	const lanes, calls, rate, burst = 16, 40, 50, 5
	c := newClock()
	set := newLimitedSet(t, c, breaker.Limits{Rate: rate, Burst: burst, MaxWait: 10 * time.Second})
	start := c.Now()
	var mu sync.Mutex
	var at []time.Time
	var finished atomic.Int32
	errs := make(chan error, lanes)
	for range lanes {
		go func() {
			defer finished.Add(1)
			for range calls {
				err := set.Do(context.Background(), "bank", func(context.Context) error {
					mu.Lock()
					at = append(at, c.Now())
					mu.Unlock()
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	// Each step: wait until every lane is done or waiting for its token,
	// then move the clock to the next token.
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := int(finished.Load())
		if n == lanes {
			break
		}
		if n+c.pending() == lanes {
			c.advanceToNext(t)
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d lanes finished, %d waiting, of %d", n, c.pending(), lanes)
		}
		runtime.Gosched()
	}
	close(errs)
	for err := range errs {
		t.Fatalf("a lane's call failed: %v", err)
	}
	slices.SortFunc(at, time.Time.Compare)
	if len(at) != lanes*calls {
		t.Fatalf("%d calls, want %d", len(at), lanes*calls)
	}
	if got := maxInWindow(at, time.Second); got > rate+burst {
		t.Fatalf("%d calls in one 1s window, want <= %d", got, rate+burst)
	}
	// Not slower than the rate either: the last call is due when the tokens
	// beyond the first burst have been earned.
	want := time.Duration(float64(lanes*calls-burst) / rate * float64(time.Second))
	if got := at[len(at)-1].Sub(start); got < want-time.Millisecond || got > want+time.Millisecond {
		t.Fatalf("last call at %s, want %s", got, want)
	}
	wantClosed(t, set)
	if st := set.LimitStates()["bank"]; st.Waited <= 0 || len(st.Throttled) != 0 {
		t.Fatalf("LimitStates = %+v, want time waited and nothing throttled", st)
	}
}

// TestMaxInFlightHoldsUnderLoad checks that no interleaving of many callers
// runs more than MaxInFlight calls at once.
func TestMaxInFlightHoldsUnderLoad(t *testing.T) {
	const callers, calls, limit = 32, 50, 4
	c := newClock() // never advanced: waits end only when a slot comes free
	set := newLimitedSet(t, c, breaker.Limits{MaxInFlight: limit})
	var now, most atomic.Int32
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				err := set.Do(context.Background(), "bank", func(context.Context) error {
					n := now.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					runtime.Gosched()
					now.Add(-1)
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if m := most.Load(); m > limit || m < 1 {
		t.Fatalf("%d calls in flight at once, want 1..%d", m, limit)
	}
	if st := set.LimitStates()["bank"]; st.InFlight != 0 {
		t.Fatalf("%d in flight after every call returned", st.InFlight)
	}
}

func TestSetLimitsBeforeConfigure(t *testing.T) {
	setClock, bankClock := newClock(), newClock()
	set := newSet(t, setClock, breaker.Settings{})
	if err := set.SetLimits("bank", breaker.Limits{Rate: 1, MaxWait: time.Nanosecond}); err != nil {
		t.Fatal(err)
	}
	// Limits do not create the breaker: it can still be configured, and its
	// clock is the limits' clock too.
	if err := set.Configure("bank", breaker.Settings{Now: bankClock.Now}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := set.Do(ctx, "bank", ok); err != nil {
		t.Fatal(err)
	}
	setClock.Advance(time.Second) // not the bank's clock: no new token
	if err := set.Do(ctx, "bank", ok); !breaker.IsThrottled(err) {
		t.Fatalf("second call = %v, want throttled by the bank's clock", err)
	}
	bankClock.Advance(time.Second)
	if err := set.Do(ctx, "bank", ok); err != nil {
		t.Fatalf("after a second of the bank's clock: %v", err)
	}
}

package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
)

func TestStateString(t *testing.T) {
	for s, want := range map[breaker.State]string{
		breaker.Closed: "closed", breaker.HalfOpen: "half-open", breaker.Open: "open", breaker.State(7): "State(7)",
	} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", int(s), got, want)
		}
	}
}

func TestClosedOpensAfterConsecutiveFailures(t *testing.T) {
	tests := []struct {
		name      string
		threshold uint32 // 0: default
		calls     []error
		want      breaker.State
	}{
		{"default trips at 5", 0, []error{errDown, errDown, errDown, errDown, errDown}, breaker.Open},
		{"default stays closed at 4", 0, []error{errDown, errDown, errDown, errDown}, breaker.Closed},
		{"threshold 1", 1, []error{errDown}, breaker.Open},
		{"threshold 3", 3, []error{errDown, errDown, errDown}, breaker.Open},
		{"success breaks the streak", 3, []error{errDown, errDown, nil, errDown, errDown}, breaker.Closed},
		{"streak after a success", 3, []error{errDown, nil, errDown, errDown, errDown}, breaker.Open},
		{"uncounted errors do not break the streak", 3, []error{errDown, errDown, handler.Permanent(errDown), errDown}, breaker.Open},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBreaker(t, newClock(), breaker.Settings{ConsecutiveFailures: tt.threshold})
			for _, e := range tt.calls {
				do(t, b, 1, func(context.Context) error { return e })
			}
			wantState(t, b, tt.want)
		})
	}
}

func TestConsecutiveFailuresSurviveWindowEnd(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 3, Window: time.Minute})
	for i := 0; i < 3; i++ {
		c.Advance(2 * time.Minute) // a slow trickle of failures, one per window
		wantState(t, b, breaker.Closed)
		do(t, b, 1, fail)
	}
	wantState(t, b, breaker.Open)
}

func TestFailureRatioTrip(t *testing.T) {
	type step struct {
		advance time.Duration
		calls   []error
	}
	f, s := errDown, error(nil)
	tests := []struct {
		name  string
		steps []step
		want  breaker.State
	}{
		{"below MinRequests", []step{{0, []error{f, s, f, s, f, s, f, s, f}}}, breaker.Closed},
		{"ratio met at MinRequests", []step{{0, []error{s, f, s, f, s, f, s, f, s, f}}}, breaker.Open},
		{"ratio is checked on a failure only", []step{{0, []error{f, s, f, s, f, s, f, s, f, s}}}, breaker.Closed},
		{"ratio not met", []step{{0, []error{f, s, s, f, s, s, f, s, s, s, s, s}}}, breaker.Closed},
		{"ratio met later", []step{{0, []error{s, s, s, s, s, s, s, s, f, f, f, f, f, f, f, f}}}, breaker.Open},
		{"ratio just missed", []step{{0, []error{s, s, s, s, s, s, s, s, f, f, f, f, f, f, f}}}, breaker.Closed},
		{"window end clears totals", []step{
			{0, []error{f, s, f, s, f, s, f, s, f}},
			{time.Minute, []error{f}},
		}, breaker.Closed},
		{"within the window", []step{
			{0, []error{f, s, f, s, f, s, f, s, f}},
			{time.Minute - time.Nanosecond, []error{f}},
		}, breaker.Open},
		{"uncounted calls are not in the ratio", []step{{0, []error{
			f, s, f, s, f, s, f, s, f,
			handler.Permanent(f), handler.Permanent(f), handler.Permanent(f),
		}}}, breaker.Closed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			b := newBreaker(t, c, breaker.Settings{
				ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 10, Window: time.Minute,
			})
			for _, st := range tt.steps {
				c.Advance(st.advance)
				for _, e := range st.calls {
					do(t, b, 1, func(context.Context) error { return e })
				}
			}
			wantState(t, b, tt.want)
		})
	}
}

func TestOpenRejectsWithRetryAfter(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: 30 * time.Second})
	tripOpen(t, b, 2)
	for _, tt := range []struct {
		advance time.Duration
		want    time.Duration
	}{
		{0, 30 * time.Second},
		{10 * time.Second, 20 * time.Second},
		{19 * time.Second, time.Second},
		{time.Second - time.Nanosecond, time.Nanosecond},
	} {
		c.Advance(tt.advance)
		called := false
		err := b.Do(context.Background(), func(context.Context) error { called = true; return nil })
		if called {
			t.Fatal("fn was called while open")
		}
		wantOpenError(t, err, breaker.Open, tt.want)
		if d, ok := breaker.RetryAfter(err); !ok || d != tt.want {
			t.Fatalf("RetryAfter = %s, %v; want %s, true", d, ok, tt.want)
		}
	}
	c.Advance(time.Nanosecond)
	wantState(t, b, breaker.HalfOpen)
}

func TestHalfOpenAdmitsExactlyProbes(t *testing.T) {
	for _, probes := range []uint32{1, 3} {
		t.Run(fmt.Sprint("probes=", probes), func(t *testing.T) {
			const callers = 10
			c := newClock()
			b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 30 * time.Second, HalfOpenProbes: probes})
			tripOpen(t, b, 1)
			c.Advance(30 * time.Second)

			entered := make(chan struct{})
			release := make(chan struct{})
			results := make(chan error, callers)
			for i := 0; i < callers; i++ {
				go func() {
					results <- b.Do(context.Background(), func(context.Context) error {
						entered <- struct{}{}
						<-release
						return nil
					})
				}()
			}
			// Every caller either enters fn (a probe) or is rejected at once.
			var in, rejected int
			for in+rejected < callers {
				select {
				case <-entered:
					in++
				case err := <-results:
					wantOpenError(t, err, breaker.HalfOpen, time.Second)
					rejected++
				}
			}
			if in != int(probes) {
				t.Fatalf("%d calls went through while half-open, want %d", in, probes)
			}
			wantState(t, b, breaker.HalfOpen)
			close(release)
			for i := 0; i < in; i++ {
				if err := <-results; err != nil {
					t.Fatalf("probe: %v", err)
				}
			}
			wantState(t, b, breaker.Closed)
		})
	}
}

func TestHalfOpenRetryAfterCappedByOpenTimeout(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 200 * time.Millisecond})
	tripOpen(t, b, 1)
	c.Advance(200 * time.Millisecond)
	err := b.Do(context.Background(), func(context.Context) error {
		wantOpenError(t, b.Do(context.Background(), ok), breaker.HalfOpen, 200*time.Millisecond)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestHalfOpenOutcome(t *testing.T) {
	tests := []struct {
		name      string
		probes    uint32
		outcomes  []error
		want      breaker.State
		wantRetry time.Duration // when want is Open: RetryAfter right after
	}{
		{"probe success closes", 1, []error{nil}, breaker.Closed, 0},
		{"probe failure reopens with a fresh cool-down", 1, []error{errDown}, breaker.Open, 30 * time.Second},
		{"one of two probes is not enough", 2, []error{nil}, breaker.HalfOpen, 0},
		{"all probes succeed", 2, []error{nil, nil}, breaker.Closed, 0},
		{"any probe failure reopens", 3, []error{nil, nil, errDown}, breaker.Open, 30 * time.Second},
		{"uncounted probe frees its slot", 1, []error{handler.Permanent(errDown), nil}, breaker.Closed, 0},
		{"uncounted probe then failure", 1, []error{handler.Permanent(errDown), errDown}, breaker.Open, 30 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 30 * time.Second, HalfOpenProbes: tt.probes})
			tripOpen(t, b, 1)
			c.Advance(45 * time.Second)
			for _, e := range tt.outcomes {
				do(t, b, 1, func(context.Context) error { return e })
			}
			wantState(t, b, tt.want)
			if tt.want == breaker.Open {
				wantOpenError(t, b.Do(context.Background(), ok), breaker.Open, tt.wantRetry)
			}
		})
	}
}

func TestClosedAfterProbeHasFreshCounts(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 3, OpenTimeout: time.Second})
	tripOpen(t, b, 3)
	c.Advance(time.Second)
	do(t, b, 1, ok)
	wantState(t, b, breaker.Closed)
	do(t, b, 2, fail)
	wantState(t, b, breaker.Closed)
	do(t, b, 1, fail)
	wantState(t, b, breaker.Open)
}

func TestUncountedErrors(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Unix(0, 0))
	t.Cleanup(cancel2)
	tests := []struct {
		name      string
		isFailure func(error) bool
		// run makes one call; it may cancel ctx before fn returns.
		run       func(b *breaker.Breaker) error
		wantCount bool
	}{
		{"permanent", nil, func(b *breaker.Breaker) error {
			return b.Do(context.Background(), func(context.Context) error { return handler.Permanent(errDown) })
		}, false},
		{"decode", nil, func(b *breaker.Breaker) error {
			return b.Do(context.Background(), func(context.Context) error { return fmt.Errorf("x: %w", handler.Decode(errDown)) })
		}, false},
		{"caller ctx cancelled during the call", nil, func(b *breaker.Breaker) error {
			ctx, cancel := context.WithCancel(context.Background())
			return b.Do(ctx, func(ctx context.Context) error { cancel(); return fmt.Errorf("call: %w", ctx.Err()) })
		}, false},
		{"caller ctx done, fn returns DeadlineExceeded", nil, func(b *breaker.Breaker) error {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			return b.Do(ctx, func(context.Context) error { cancel(nil); return context.DeadlineExceeded })
		}, false},
		{"caller ctx already cancelled", nil, func(b *breaker.Breaker) error { return b.Do(cancelled, fail) }, false},
		{"caller ctx already expired", nil, func(b *breaker.Breaker) error { return b.Do(expired, fail) }, false},
		{"another breaker is open", nil, func(b *breaker.Breaker) error {
			return b.Do(context.Background(), func(context.Context) error {
				return &breaker.OpenError{Name: "other", State: breaker.Open, RetryAfter: time.Second}
			})
		}, false},
		{"custom IsFailure says no", func(err error) bool { return !errors.Is(err, errDown) }, func(b *breaker.Breaker) error {
			return b.Do(context.Background(), fail)
		}, false},
		{"dependency's own deadline counts", nil, func(b *breaker.Breaker) error {
			return b.Do(context.Background(), func(context.Context) error { return context.DeadlineExceeded })
		}, true},
		{"plain error counts", nil, func(b *breaker.Breaker) error { return b.Do(context.Background(), fail) }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newClock()
			b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 3, IsFailure: tt.isFailure})
			for i := 0; i < 3; i++ {
				if err := tt.run(b); err == nil {
					t.Fatalf("call %d: err = %v", i+1, err)
				}
			}
			want := breaker.Closed
			if tt.wantCount {
				want = breaker.Open
			}
			wantState(t, b, want)
		})
	}
}

func TestDoneContextTakesNoProbeSlot(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: time.Second})
	tripOpen(t, b, 1)
	c.Advance(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	called := false
	if err := b.Do(ctx, func(context.Context) error { called = true; return nil }); !errors.Is(err, context.Canceled) || called {
		t.Fatalf("Do(cancelled) = %v, called = %v; want context.Canceled, not called", err, called)
	}
	do(t, b, 1, ok) // the slot is still free
	wantState(t, b, breaker.Closed)
}

func TestLateOutcomeIgnored(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: time.Second})
	entered, release, done := make(chan struct{}), make(chan struct{}), make(chan error)
	go func() {
		done <- b.Do(context.Background(), func(context.Context) error { close(entered); <-release; return nil })
	}()
	<-entered
	tripOpen(t, b, 1) // opens while the slow call runs
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wantState(t, b, breaker.Open) // its success, admitted while closed, does not count
}

func TestPanicCountsAsFailure(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: time.Second})
	tripOpen(t, b, 1)
	c.Advance(time.Second)
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want boom", r)
			}
		}()
		_ = b.Do(context.Background(), func(context.Context) error { panic("boom") })
	}()
	wantState(t, b, breaker.Open) // the panicking probe reopened it
	wantOpenError(t, b.Do(context.Background(), ok), breaker.Open, time.Second)
}

func TestOnStateChangeSeesEveryTransition(t *testing.T) {
	c := newClock()
	var r recorder
	var b *breaker.Breaker
	b = newBreaker(t, c, breaker.Settings{
		ConsecutiveFailures: 2, OpenTimeout: 10 * time.Second,
		OnStateChange: func(name string, from, to breaker.State) {
			// The announcement (from == to) comes in New, before b is set;
			// on a transition the hook may call State: no lock is held.
			if from != to {
				if got := b.State(); got != to {
					t.Errorf("State() in OnStateChange = %s, want %s", got, to)
				}
			}
			r.hook(name, from, to)
		},
	})
	do(t, b, 2, fail) // closed -> open
	c.Advance(10 * time.Second)
	do(t, b, 1, fail) // open -> half-open -> open
	c.Advance(5 * time.Second)
	wantState(t, b, breaker.Open)
	c.Advance(5 * time.Second)
	wantState(t, b, breaker.HalfOpen) // open -> half-open, noticed by State
	do(t, b, 1, ok)                   // half-open -> closed
	want := []string{
		"dep: closed -> open",
		"dep: open -> half-open",
		"dep: half-open -> open",
		"dep: open -> half-open",
		"dep: half-open -> closed",
	}
	if got := r.got(); !slices.Equal(got, want) {
		t.Fatalf("transitions:\n got %q\nwant %q", got, want)
	}
}

// TestNewBreakerIsAnnounced: OnStateChange hears of every breaker once, with
// from == to == Closed, at its creation and before any transition, so a
// state gauge has a series for a breaker that never changes state.
func TestNewBreakerIsAnnounced(t *testing.T) {
	c := newClock()
	var mu sync.Mutex
	var calls []string
	hook := func(name string, from, to breaker.State) {
		mu.Lock()
		calls = append(calls, name+": "+from.String()+" -> "+to.String())
		mu.Unlock()
	}
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OnStateChange: hook})
	do(t, b, 1, ok)
	do(t, b, 1, fail) // closed -> open
	set, err := breaker.NewSet(breaker.Settings{Now: c.Now, OnStateChange: hook})
	if err != nil {
		t.Fatal(err)
	}
	_ = set.Get("bank-api")
	_ = set.Do(context.Background(), "ledger", ok)
	_ = set.Do(context.Background(), "ledger", ok)
	mu.Lock()
	defer mu.Unlock()
	want := []string{"dep: closed -> closed", "dep: closed -> open", "bank-api: closed -> closed", "ledger: closed -> closed"}
	if !slices.Equal(calls, want) {
		t.Fatalf("OnStateChange calls:\n got %q\nwant %q", calls, want)
	}
}

// TestNewAnnouncesAtCreation: New announces the breaker (Closed -> Closed)
// before it returns, so a state gauge has its series from the breaker's
// creation on, not from its first call: a dependency that is configured but
// not called yet is visible as closed.
func TestNewAnnouncesAtCreation(t *testing.T) {
	var mu sync.Mutex
	var calls []string
	b, err := breaker.New("bank-api", breaker.Settings{OnStateChange: func(name string, from, to breaker.State) {
		mu.Lock()
		calls = append(calls, name+": "+from.String()+" -> "+to.String())
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Clone(calls)
	mu.Unlock()
	if want := []string{"bank-api: closed -> closed"}; !slices.Equal(got, want) {
		t.Fatalf("OnStateChange calls after New, before any use:\n got %q\nwant %q", got, want)
	}
	_ = b.State() // a later use announces nothing more
	_ = b.Do(context.Background(), ok)
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 {
		t.Fatalf("OnStateChange calls after use: %q, want the one announcement", calls)
	}
}

func TestOnStateChangeMayCallDo(t *testing.T) {
	c := newClock()
	var r recorder
	var b *breaker.Breaker
	b = newBreaker(t, c, breaker.Settings{
		ConsecutiveFailures: 1, OpenTimeout: time.Second,
		OnStateChange: func(name string, from, to breaker.State) {
			r.hook(name, from, to)
			if to == breaker.Open {
				c.Advance(time.Second)
				_ = b.Do(context.Background(), ok) // re-entrant: half-open -> closed
			}
		},
	})
	do(t, b, 1, fail)
	want := []string{"dep: closed -> open", "dep: open -> half-open", "dep: half-open -> closed"}
	if got := r.got(); !slices.Equal(got, want) {
		t.Fatalf("transitions:\n got %q\nwant %q", got, want)
	}
}

// TestConcurrentUse exercises every path under -race; it asserts only the
// invariants that hold under any interleaving.
func TestConcurrentUse(t *testing.T) {
	c := newClock()
	var mu sync.Mutex
	var last breaker.State
	b := newBreaker(t, c, breaker.Settings{
		ConsecutiveFailures: 3, OpenTimeout: time.Second, HalfOpenProbes: 2,
		OnStateChange: func(_ string, from, to breaker.State) {
			mu.Lock()
			defer mu.Unlock()
			if from != last {
				t.Errorf("transition from %s, but the last state reported was %s", from, last)
			}
			last = to
		},
	})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 500; i++ {
				if i%50 == 0 {
					c.Advance(300 * time.Millisecond)
				}
				fn := ok
				if (i+g)%3 != 0 {
					fn = fail
				}
				err := b.Do(context.Background(), fn)
				if d, isOpen := breaker.RetryAfter(err); isOpen && (d <= 0 || d > time.Second) {
					t.Errorf("RetryAfter = %s, want in (0, 1s]", d)
				}
				_ = b.State()
			}
		}()
	}
	wg.Wait()
}

package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
)

var err429 = errors.New("bank: HTTP 429")

// tooMany answers like a dependency at its quota: 429 with Retry-After d.
func tooMany(d time.Duration) func(context.Context) error {
	return func(context.Context) error { return handler.RetryAfter(err429, d) }
}

func TestRetryAfterPausesCalls(t *testing.T) {
	c := newClock()
	set := newSet(t, c, breaker.Settings{ConsecutiveFailures: 1}) // one counted failure would open it
	ctx := context.Background()

	err := set.Do(ctx, "bank", tooMany(2*time.Second))
	var te *breaker.ThrottleError
	if !errors.As(err, &te) || te.Reason != breaker.ReasonRetryAfter || te.Name != "bank" {
		t.Fatalf("429 = %v, want a ReasonRetryAfter *ThrottleError", err)
	}
	if !breaker.IsOpen(err) || breaker.Rejected(err) || !errors.Is(err, err429) {
		t.Fatalf("IsOpen %v, Rejected %v, wraps the answer %v: want true, false (fn ran), true",
			breaker.IsOpen(err), breaker.Rejected(err), errors.Is(err, err429))
	}
	if d, ok := breaker.RetryAfter(err); !ok || d != 2*time.Second {
		t.Fatalf("RetryAfter = %s, %v; want 2s", d, ok)
	}
	wantClosed(t, set) // the 429 is not a failure

	var called atomic.Int32
	count := func(context.Context) error { called.Add(1); return nil }
	c.Advance(500 * time.Millisecond)
	wantThrottle(t, set.Do(ctx, "bank", count), breaker.ReasonRetryAfter, 1500*time.Millisecond)
	if err := set.Do(ctx, "ledger", count); err != nil { // other dependencies go on
		t.Fatalf("ledger: %v", err)
	}
	c.Advance(1499 * time.Millisecond)
	wantThrottle(t, set.Do(ctx, "bank", count), breaker.ReasonRetryAfter, time.Millisecond)
	if n := called.Load(); n != 1 {
		t.Fatalf("fn called %d times during the pause (ledger once), want 1", n)
	}
	c.Advance(time.Millisecond) // the pause is over
	if err := set.Do(ctx, "bank", count); err != nil {
		t.Fatalf("after the pause: %v", err)
	}
	wantClosed(t, set)
	st := set.LimitStates()["bank"]
	if st.Paused != 2*time.Second || st.PauseLeft != 0 || st.Throttled[breaker.ReasonRetryAfter] != 3 {
		t.Fatalf("LimitStates = %+v, want 2s paused, none left, 3 throttled calls", st)
	}

	// A second pause adds to the total; while it runs, PauseLeft shows it.
	_ = set.Do(ctx, "bank", tooMany(time.Second))
	c.Advance(250 * time.Millisecond)
	if st := set.LimitStates()["bank"]; st.Paused != 2250*time.Millisecond || st.PauseLeft != 750*time.Millisecond {
		t.Fatalf("LimitStates = %+v, want 2.25s paused, 750ms left", st)
	}
}

func TestRetryAfterKeepsTheLaterPause(t *testing.T) {
	c := newClock()
	set := newSet(t, c, breaker.Settings{})
	ctx := context.Background()
	// A call already running when the dependency asks for a 2s pause gets
	// its own 429 asking for 1s: the pause still ends at 2s.
	answer := make(chan error)
	running := make(chan struct{})
	slow := make(chan error, 1)
	go func() {
		slow <- set.Do(ctx, "bank", func(context.Context) error { close(running); return <-answer })
	}()
	<-running
	_ = set.Do(ctx, "bank", tooMany(2*time.Second))
	c.Advance(500 * time.Millisecond)
	answer <- handler.RetryAfter(err429, time.Second)
	if d, _ := breaker.RetryAfter(result(t, slow)); d != 1500*time.Millisecond {
		t.Fatalf("RetryAfter = %s, want the 1.5s left of the longer pause", d)
	}
	wantThrottle(t, set.Do(ctx, "bank", ok), breaker.ReasonRetryAfter, 1500*time.Millisecond)
}

func TestRetryAfterWithoutDelay(t *testing.T) {
	c := newClock()
	set := newSet(t, c, breaker.Settings{OpenTimeout: 10 * time.Second})
	// A 429 without a usable Retry-After pauses for min(OpenTimeout, 1s).
	if d, _ := breaker.RetryAfter(set.Do(context.Background(), "bank", tooMany(0))); d != time.Second {
		t.Fatalf("RetryAfter = %s, want 1s", d)
	}
}

func TestWhatIsNotARetryAfterAnswer(t *testing.T) {
	c := newClock()
	set := newSet(t, c, breaker.Settings{ConsecutiveFailures: 2})
	ctx := context.Background()
	inner := &breaker.ThrottleError{Name: "psp", Reason: breaker.ReasonRetryAfter, RetryAfter: time.Second,
		Cause: handler.RetryAfter(err429, time.Second)}
	for name, answer := range map[string]error{
		// A nested dependency's pause belongs to that dependency.
		"nested pause": fmt.Errorf("charge: %w", inner),
		// Bad input is bad input, whatever delay it carries.
		"permanent": handler.Permanent(handler.RetryAfter(err429, time.Second)),
	} {
		err := set.Do(ctx, "bank", func(context.Context) error { return answer })
		if err != answer {
			t.Errorf("%s: Do = %v, want fn's error unchanged", name, err)
		}
		if st := set.LimitStates()["bank"]; st.PauseLeft != 0 {
			t.Errorf("%s: bank paused for %s", name, st.PauseLeft)
		}
	}
	wantClosed(t, set) // neither was counted
	// A handler's own handler.RetryAfter, outside Do, reaches no Set: there
	// is nothing to pause. Inside Do, only fn's error counts: an ordinary
	// failure is still a failure.
	_ = set.Do(ctx, "bank", fail)
	_ = set.Do(ctx, "bank", fail)
	if st := set.States()["bank"]; st != breaker.Open {
		t.Fatalf("breaker %s after two failures, want open", st)
	}
}

func TestRetryAfterFreesHalfOpenProbe(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 5 * time.Second})
	ctx := context.Background()
	tripOpen(t, b, 1)
	c.Advance(5 * time.Second)
	// The probe meets a 429: the breaker stays half-open (no verdict), the
	// dependency is paused, and the probe slot is free again after it.
	err := b.Do(ctx, tooMany(3*time.Second))
	if d, _ := breaker.RetryAfter(err); !breaker.IsThrottled(err) || d != 3*time.Second {
		t.Fatalf("probe's 429 = %v, want a 3s *ThrottleError", err)
	}
	wantState(t, b, breaker.HalfOpen)
	var te *breaker.ThrottleError
	if err := b.Do(ctx, ok); !errors.As(err, &te) || te.Name != "dep" || !breaker.Rejected(err) {
		t.Fatalf("during the pause: %v, want a rejection by the pause", err)
	}
	c.Advance(3 * time.Second)
	do(t, b, 1, ok) // the next probe; its success closes the breaker
	wantState(t, b, breaker.Closed)
	// While open, the breaker's *OpenError comes first.
	tripOpen(t, b, 1)
	if err := b.Do(ctx, ok); breaker.IsThrottled(err) || !breaker.IsOpen(err) {
		t.Fatalf("open breaker: %v, want its *OpenError", err)
	}
}

func TestPausedCallsTakeNoTokenAndDoNotWait(t *testing.T) {
	c := newClock()
	set := newLimitedSet(t, c, breaker.Limits{Rate: 1, MaxWait: 10 * time.Second})
	ctx := context.Background()
	_ = set.Do(ctx, "bank", tooMany(time.Second)) // takes the one token; pauses 1s
	// During the pause a call is refused at once: it neither waits for the
	// next token (due when the pause ends) nor takes it.
	wantThrottle(t, result(t, async(ctx, set, ok)), breaker.ReasonRetryAfter, time.Second)
	c.Advance(time.Second)
	if err := result(t, async(ctx, set, ok)); err != nil { // the token is there: no wait
		t.Fatal(err)
	}
	if st := set.LimitStates()["bank"]; st.Waited != 0 {
		t.Fatalf("waited %s, want 0", st.Waited)
	}
}

func TestThrottleErrorHelpers(t *testing.T) {
	for _, tc := range []struct {
		e    *breaker.ThrottleError
		want string
	}{
		{&breaker.ThrottleError{Name: "bank", Reason: breaker.ReasonRetryAfter, RetryAfter: 2 * time.Second, Cause: err429}, `"bank" asked to wait: bank: HTTP 429: paused for 2s`},
		{&breaker.ThrottleError{Name: "bank", Reason: breaker.ReasonRetryAfter, RetryAfter: time.Second}, `"bank" is paused at its request: retry after 1s`},
		{&breaker.ThrottleError{Name: "bank", Reason: breaker.ReasonRate, RetryAfter: 5 * time.Millisecond}, `"bank" is over its rate limit: retry after 5ms`},
		{&breaker.ThrottleError{Name: "bank", Reason: breaker.ReasonInFlight, RetryAfter: time.Second}, `"bank" has no free call slot (in-flight): retry after 1s`},
	} {
		if got := tc.e.Error(); !strings.Contains(got, tc.want) {
			t.Errorf("Error() = %q, want it to contain %q", got, tc.want)
		}
		wrapped := fmt.Errorf("handler: %w", tc.e)
		if !errors.Is(wrapped, breaker.ErrThrottled) || !errors.Is(wrapped, breaker.ErrOpen) || !breaker.IsOpen(wrapped) {
			t.Errorf("%v: not ErrThrottled and ErrOpen", tc.e)
		}
		if breaker.Rejected(wrapped) != (tc.e.Cause == nil) {
			t.Errorf("Rejected(%v) = %v", tc.e, breaker.Rejected(wrapped))
		}
		if d, ok := breaker.RetryAfter(wrapped); !ok || d != tc.e.RetryAfter {
			t.Errorf("RetryAfter = %s, %v", d, ok)
		}
		if breaker.IsFailure(wrapped) {
			t.Errorf("IsFailure(%v) = true, want false", tc.e)
		}
	}
	if breaker.IsThrottled(&breaker.OpenError{Name: "bank", State: breaker.Open}) {
		t.Error("IsThrottled true for an *OpenError")
	}
}

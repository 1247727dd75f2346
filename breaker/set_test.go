package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/internal/configerr"
)

func newSet(tb testing.TB, c *fakeClock, s breaker.Settings) *breaker.Set {
	tb.Helper()
	s.Now = c.Now
	set, err := breaker.NewSet(s)
	if err != nil {
		tb.Fatalf("NewSet: %v", err)
	}
	return set
}

func TestSetBreakersAreIndependent(t *testing.T) {
	c := newClock()
	var r recorder
	set := newSet(t, c, breaker.Settings{ConsecutiveFailures: 2, OnStateChange: r.hook})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		_ = set.Do(ctx, "bank-api", fail)
		_ = set.Do(ctx, "ledger", ok)
	}
	wantOpenError(t, set.Do(ctx, "bank-api", ok), breaker.Open, 30*time.Second)
	if err := set.Do(ctx, "ledger", ok); err != nil {
		t.Fatalf("ledger: %v", err)
	}
	if a, b := set.Get("bank-api"), set.Get("bank-api"); a != b {
		t.Fatal("Get returned different breakers for one name")
	}
	if got := set.Get("bank-api").Name(); got != "bank-api" {
		t.Fatalf("Name() = %q", got)
	}
	want := map[string]breaker.State{"bank-api": breaker.Open, "ledger": breaker.Closed}
	if got := set.States(); !maps.Equal(got, want) {
		t.Fatalf("States() = %v, want %v", got, want)
	}
	c.Advance(30 * time.Second)
	want["bank-api"] = breaker.HalfOpen
	if got := set.States(); !maps.Equal(got, want) {
		t.Fatalf("States() after cool-down = %v, want %v", got, want)
	}
	if got, w := r.got(), []string{"bank-api: closed -> open", "bank-api: open -> half-open"}; !slices.Equal(got, w) {
		t.Fatalf("transitions %q, want %q", got, w)
	}
}

func TestSetConfigure(t *testing.T) {
	c := newClock()
	var r recorder
	set := newSet(t, c, breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: 10 * time.Second, OnStateChange: r.hook})
	if err := set.Configure("slow-api", breaker.Settings{OpenTimeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		_ = set.Do(ctx, "slow-api", fail) // ConsecutiveFailures inherited from the Set
		_ = set.Do(ctx, "other", fail)
	}
	wantOpenError(t, set.Do(ctx, "slow-api", ok), breaker.Open, time.Minute)
	wantOpenError(t, set.Do(ctx, "other", ok), breaker.Open, 10*time.Second)
	if got := r.got(); len(got) != 2 { // OnStateChange inherited too
		t.Fatalf("transitions %q, want one per breaker", got)
	}

	err := set.Configure("slow-api", breaker.Settings{})
	if !errors.Is(err, breaker.ErrInUse) || !strings.Contains(err.Error(), `"slow-api"`) {
		t.Fatalf("Configure after use = %v, want ErrInUse naming the breaker", err)
	}
	err = set.Configure("new", breaker.Settings{FailureRatio: 2})
	var se *configerr.Error
	if (err == nil || !strings.Contains(err.Error(), "breaker: invalid settings")) || !errors.As(err, &se) || se.Field != "Settings.FailureRatio" {
		t.Fatalf("Configure(bad) = %v, want an error naming Settings.FailureRatio", err)
	}
}

func TestSetConcurrentFirstUse(t *testing.T) {
	set := newSet(t, newClock(), breaker.Settings{})
	const n = 16
	got := make([]*breaker.Breaker, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = set.Get("dep")
			_ = set.Do(context.Background(), fmt.Sprint("dep-", i%4), ok)
			_ = set.States()
		}()
	}
	wg.Wait()
	for _, b := range got {
		if b != got[0] {
			t.Fatal("concurrent Get created more than one breaker for a name")
		}
	}
	if got := len(set.States()); got != 5 {
		t.Fatalf("%d breakers, want 5", got)
	}
}

func TestOpenErrorHelpers(t *testing.T) {
	oe := &breaker.OpenError{Name: "bank-api", State: breaker.Open, RetryAfter: 12 * time.Second}
	wrapped := fmt.Errorf("charge: %w", oe)
	if !breaker.IsOpen(wrapped) || !errors.Is(wrapped, breaker.ErrOpen) {
		t.Fatal("IsOpen/errors.Is(ErrOpen) false for a wrapped *OpenError")
	}
	if d, ok := breaker.RetryAfter(wrapped); !ok || d != 12*time.Second {
		t.Fatalf("RetryAfter = %s, %v", d, ok)
	}
	if d, ok := breaker.RetryAfter(errDown); ok || d != 0 {
		t.Fatalf("RetryAfter(plain) = %s, %v", d, ok)
	}
	if d, _ := breaker.RetryAfter(&breaker.OpenError{RetryAfter: -time.Second}); d != 0 {
		t.Fatalf("RetryAfter(negative) = %s, want 0", d)
	}
	if breaker.IsOpen(errDown) || breaker.IsOpen(nil) {
		t.Fatal("IsOpen true for a non-breaker error")
	}
	for _, e := range []*breaker.OpenError{oe, {Name: "bank-api", State: breaker.HalfOpen, RetryAfter: time.Second}} {
		msg := e.Error()
		if !strings.Contains(msg, `"bank-api"`) || !strings.Contains(msg, "retry after "+e.RetryAfter.String()) {
			t.Errorf("Error() = %q, want the name and the retry-after", msg)
		}
	}
}

func TestZeroSet(t *testing.T) {
	var set breaker.Set
	if err := set.Configure("a", breaker.Settings{ConsecutiveFailures: 1}); err != nil {
		t.Fatal(err)
	}
	_ = set.Do(context.Background(), "a", fail)
	_ = set.Do(context.Background(), "b", fail)
	want := map[string]breaker.State{"a": breaker.Open, "b": breaker.Closed}
	if got := set.States(); !maps.Equal(got, want) {
		t.Fatalf("States() = %v, want %v", got, want)
	}
}

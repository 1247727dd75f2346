package forward

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWaitDueNeverEarly(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 0, 30 * time.Millisecond, 120 * time.Millisecond} {
		due := time.Now().Add(d)
		if err := WaitDue(context.Background(), due, nil); err != nil {
			t.Fatalf("WaitDue(%s) = %v", d, err)
		}
		if now := time.Now(); now.Before(due) {
			t.Fatalf("WaitDue(%s) returned %s early", d, due.Sub(now))
		}
	}
}

// A clock that lags the real one makes WaitDue wait longer, never shorter.
func TestWaitDueLaggingClock(t *testing.T) {
	lag := 80 * time.Millisecond
	now := func() time.Time { return time.Now().Add(-lag) }
	start := time.Now()
	due := start.Add(40 * time.Millisecond)
	if err := WaitDue(context.Background(), due, now); err != nil {
		t.Fatal(err)
	}
	if now().Before(due) {
		t.Fatalf("returned before due by the given clock")
	}
	if el := time.Since(start); el < 120*time.Millisecond {
		t.Fatalf("returned after %s, want >= 120ms by the real clock", el)
	}
}

func TestWaitDueCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- WaitDue(ctx, time.Now().Add(time.Hour), nil) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitDue = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitDue did not return after cancel")
	}

	// Already cancelled: ctx.Err() even when due has passed.
	if err := WaitDue(ctx, time.Now().Add(-time.Hour), nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitDue(cancelled, past due) = %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	if err := WaitDue(dctx, time.Now().Add(time.Hour), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitDue(deadline) = %v", err)
	}
}

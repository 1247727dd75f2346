package consumer

import (
	"context"
	"errors"
	"testing"

	"github.com/idemhq/idem/dedupe"
)

// storeFunc is a dedupe.Store whose Process is a function.
type storeFunc func(ctx context.Context, rec dedupe.Record, fn func(context.Context) error) (dedupe.Outcome, error)

func (f storeFunc) Process(ctx context.Context, rec dedupe.Record, fn func(context.Context) error) (dedupe.Outcome, error) {
	return f(ctx, rec, fn)
}

// pingStore is a store with a Ping method of its own.
type pingStore struct {
	dedupe.Store
	err error
}

func (s pingStore) Ping(context.Context) error { return s.err }

// storePing asks a store with Ping through it, takes Memory as reachable,
// and otherwise runs the probe key through Process: the store answering
// (the probe's own error, a duplicate, another member's claim) is reachable,
// a store failure is not.
func TestStorePing(t *testing.T) {
	down := &dedupe.StoreError{Op: "begin", Err: errors.New("connection refused")}
	run := func(ctx context.Context, rec dedupe.Record, fn func(context.Context) error) (dedupe.Outcome, error) {
		if rec.Key != probeKey || rec.Group != "g" {
			t.Errorf("probe record %+v", rec)
		}
		return 0, fn(ctx)
	}
	for _, tc := range []struct {
		name  string
		store dedupe.Store
		ok    bool
	}{
		{"memory", dedupe.NewMemory(), true},
		{"pinger ok", pingStore{err: nil}, true},
		{"pinger down", pingStore{err: down}, false},
		{"process rolls back", storeFunc(run), true},
		{"process duplicate", storeFunc(func(context.Context, dedupe.Record, func(context.Context) error) (dedupe.Outcome, error) {
			return dedupe.Duplicate, nil
		}), true},
		{"process in progress", storeFunc(func(context.Context, dedupe.Record, func(context.Context) error) (dedupe.Outcome, error) {
			return 0, &dedupe.StoreError{Op: "claim", Err: dedupe.ErrInProgress}
		}), true},
		{"process down", storeFunc(func(context.Context, dedupe.Record, func(context.Context) error) (dedupe.Outcome, error) {
			return 0, down
		}), false},
	} {
		err := storePing(Config{Group: "g", Dedupe: tc.store})(context.Background())
		if (err == nil) != tc.ok {
			t.Errorf("%s: ping = %v, want reachable %v", tc.name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, down) {
			t.Errorf("%s: %v does not wrap the store's error", tc.name, err)
		}
	}
}

// Check says why it is not ready: not running, not joined; and is ready
// with no partition claimed whatever the store says.
func TestReadinessStates(t *testing.T) {
	r := NewReadiness()
	ctx := context.Background()
	if err := r.Check(ctx); !errors.Is(err, ErrNotReady) {
		t.Fatalf("new: %v", err)
	}
	down := errors.New("down")
	r.start("g", func(context.Context) error { return down })
	if err := r.Check(ctx); !errors.Is(err, ErrNotReady) {
		t.Fatalf("not joined: %v", err)
	}
	r.setJoined(true)
	if err := r.Check(ctx); err != nil {
		t.Fatalf("joined, nothing claimed: %v", err)
	}
	r.claimed(tp{"t", 0}, true)
	if err := r.Check(ctx); !errors.Is(err, ErrNotReady) || !errors.Is(err, down) {
		t.Fatalf("claimed, store down: %v", err)
	}
	r.claimed(tp{"t", 0}, false)
	if err := r.Check(ctx); err != nil {
		t.Fatalf("released: %v", err)
	}
	r.stop()
	if err := r.Check(ctx); !errors.Is(err, ErrNotReady) {
		t.Fatalf("stopped: %v", err)
	}
}

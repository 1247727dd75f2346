// Package dedupetest is the conformance suite for dedupe.Store
// implementations. Every Store shipped with idem passes it, and a custom Store
// should too:
//
//	func TestMyStore(t *testing.T) {
//		dedupetest.Run(t, newMyStore)
//	}
//
//	// newMyStore returns a fresh, empty store for one subtest.
//	func newMyStore(t *testing.T) dedupe.Store {
//		return dedupe.NewMemory() // your store here
//	}
//
// The suite checks the contract written on dedupe.Store: a recorded key is a
// Duplicate and fn is not called; a failed or panicking fn records nothing
// and a later call processes the key; concurrent calls for one key process it
// exactly once; keys and groups are independent; a done ctx fails with a
// *dedupe.StoreError without calling fn; an empty key is rejected; fn's error
// is returned unchanged; a key is processed once in each replay epoch
// (Record.Epoch), and a negative epoch is rejected.
package dedupetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/dedupe"
)

// Run runs the conformance suite as subtests of t. newStore is called once per
// subtest, with the subtest's t, and must return a ready store (for a
// database-backed store: migrated, with cleanups registered on t). Groups and
// keys are random per subtest, so a shared store also works.
func Run(t *testing.T, newStore func(t *testing.T) dedupe.Store) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(t *testing.T, s dedupe.Store)
	}{
		{"FirstIsProcessed", testFirstIsProcessed},
		{"DuplicateAfterSuccess", testDuplicateAfterSuccess},
		{"FailureNotRecorded", testFailureNotRecorded},
		{"PanicNotRecorded", testPanicNotRecorded},
		{"ConcurrentSameKey", testConcurrentSameKey},
		{"DifferentKeysIndependent", testDifferentKeys},
		{"DifferentGroupsIndependent", testDifferentGroups},
		{"CancelledContext", testCancelledContext},
		{"ContextValuesReachFn", testContextValues},
		{"EmptyKeyRejected", testEmptyKey},
		{"EachEpochOnce", testEachEpochOnce},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newStore(t)) })
	}
}

// isStoreError reports whether err is, or wraps, a *dedupe.StoreError.
func isStoreError(err error) bool {
	_, ok := errors.AsType[*dedupe.StoreError](err)
	return ok
}

func unique(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

func record(group, key string) dedupe.Record {
	return dedupe.Record{Group: group, Key: key, Topic: "dedupetest", Partition: 3, Offset: 42}
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// process calls s.Process and counts fn calls in calls.
func process(ctx context.Context, s dedupe.Store, rec dedupe.Record, calls *atomic.Int32, ret error) (dedupe.Outcome, error) {
	return s.Process(ctx, rec, func(context.Context) error {
		calls.Add(1)
		return ret
	})
}

func mustOutcome(t *testing.T, got dedupe.Outcome, err error, want dedupe.Outcome) {
	t.Helper()
	if err != nil || got != want {
		t.Fatalf("Process = (%v, %v), want (%v, nil)", got, err, want)
	}
}

func testFirstIsProcessed(t *testing.T, s dedupe.Store) {
	var calls atomic.Int32
	out, err := process(testContext(t), s, record(unique("g"), unique("k")), &calls, nil)
	mustOutcome(t, out, err, dedupe.Processed)
	if calls.Load() != 1 {
		t.Fatalf("fn called %d times, want 1", calls.Load())
	}
}

func testDuplicateAfterSuccess(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	rec := record(unique("g"), unique("k"))
	var calls atomic.Int32
	out, err := process(ctx, s, rec, &calls, nil)
	mustOutcome(t, out, err, dedupe.Processed)
	for range 3 {
		rec.Offset++ // a redelivery may come at another offset: only (Group, Key) counts
		out, err = process(ctx, s, rec, &calls, nil)
		mustOutcome(t, out, err, dedupe.Duplicate)
	}
	if calls.Load() != 1 {
		t.Fatalf("fn called %d times, want 1", calls.Load())
	}
}

type handlerError struct{ msg string }

func (e *handlerError) Error() string { return e.msg }

func testFailureNotRecorded(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	rec := record(unique("g"), unique("k"))
	want := &handlerError{"boom"}
	var calls atomic.Int32
	out, err := process(ctx, s, rec, &calls, want)
	if err != error(want) || out != 0 {
		t.Fatalf("Process = (%v, %v), want (0, fn's error unchanged %p)", out, err, want)
	}
	if isStoreError(err) {
		t.Fatalf("fn's error reported as a store error: %v", err)
	}
	out, err = process(ctx, s, rec, &calls, nil)
	mustOutcome(t, out, err, dedupe.Processed)
	out, err = process(ctx, s, rec, &calls, nil)
	mustOutcome(t, out, err, dedupe.Duplicate)
	if calls.Load() != 2 {
		t.Fatalf("fn called %d times, want 2", calls.Load())
	}
}

func testPanicNotRecorded(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	rec := record(unique("g"), unique("k"))
	func() {
		defer func() {
			if r := recover(); r != "handler panic" {
				t.Fatalf("recovered %v, want the handler's panic value", r)
			}
		}()
		_, _ = s.Process(ctx, rec, func(context.Context) error { panic("handler panic") })
		t.Fatal("Process returned after fn panicked")
	}()
	var calls atomic.Int32
	out, err := process(ctx, s, rec, &calls, nil)
	mustOutcome(t, out, err, dedupe.Processed)
}

// testConcurrentSameKey runs one key from several goroutines. A goroutine
// that gets a retriable store error (a lease store's ErrInProgress) retries,
// polling until a deadline, as the consumer would.
func testConcurrentSameKey(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	rec := record(unique("g"), unique("k"))
	const n = 8
	var calls, processed, duplicates atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			<-start
			deadline := time.Now().Add(30 * time.Second)
			for {
				out, err := s.Process(ctx, rec, func(ctx context.Context) error {
					calls.Add(1)
					select { // widen the race window
					case <-time.After(20 * time.Millisecond):
					case <-ctx.Done():
					}
					return nil
				})
				switch {
				case err == nil && out == dedupe.Processed:
					processed.Add(1)
				case err == nil && out == dedupe.Duplicate:
					duplicates.Add(1)
				case isStoreError(err) && time.Now().Before(deadline):
					select { // retry backoff while the holder finishes
					case <-time.After(5 * time.Millisecond):
					case <-ctx.Done():
					}
					continue
				default:
					errs <- fmt.Errorf("process = (%v, %v)", out, err)
				}
				return
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if calls.Load() != 1 || processed.Load() != 1 || duplicates.Load() != n-1 {
		t.Fatalf("fn calls %d, processed %d, duplicates %d; want 1, 1, %d", calls.Load(), processed.Load(), duplicates.Load(), n-1)
	}
}

func testDifferentKeys(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	g := unique("g")
	var calls atomic.Int32
	for i := range 5 {
		out, err := process(ctx, s, record(g, fmt.Sprintf("key-%d", i)), &calls, nil)
		mustOutcome(t, out, err, dedupe.Processed)
	}
	if calls.Load() != 5 {
		t.Fatalf("fn called %d times, want 5", calls.Load())
	}
}

func testDifferentGroups(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	key := unique("k")
	var calls atomic.Int32
	for _, g := range []string{unique("a"), unique("b")} {
		out, err := process(ctx, s, record(g, key), &calls, nil)
		mustOutcome(t, out, err, dedupe.Processed)
		out, err = process(ctx, s, record(g, key), &calls, nil)
		mustOutcome(t, out, err, dedupe.Duplicate)
	}
	if calls.Load() != 2 {
		t.Fatalf("fn called %d times, want 2", calls.Load())
	}
}

func testCancelledContext(t *testing.T, s dedupe.Store) {
	rec := record(unique("g"), unique("k"))
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	var calls atomic.Int32
	out, err := process(ctx, s, rec, &calls, nil)
	if out != 0 || !errors.Is(err, context.Canceled) || !isStoreError(err) {
		t.Fatalf("Process with cancelled ctx = (%v, %v), want (0, *StoreError wrapping context.Canceled)", out, err)
	}
	if calls.Load() != 0 {
		t.Fatal("fn called with a cancelled ctx")
	}
	out, err = process(testContext(t), s, rec, &calls, nil)
	mustOutcome(t, out, err, dedupe.Processed)
}

type ctxKey struct{}

func testContextValues(t *testing.T, s dedupe.Store) {
	ctx := context.WithValue(testContext(t), ctxKey{}, "v")
	var got any
	out, err := s.Process(ctx, record(unique("g"), unique("k")), func(ctx context.Context) error {
		got = ctx.Value(ctxKey{})
		return nil
	})
	mustOutcome(t, out, err, dedupe.Processed)
	if got != "v" {
		t.Fatalf("fn's ctx lacks the caller's values: got %v", got)
	}
}

func testEmptyKey(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	var calls atomic.Int32
	for _, rec := range []dedupe.Record{record(unique("g"), ""), record("", unique("k"))} {
		out, err := process(ctx, s, rec, &calls, nil)
		if out != 0 || !errors.Is(err, dedupe.ErrInvalidRecord) {
			t.Errorf("Process(%+v) = (%v, %v), want (0, ErrInvalidRecord)", rec, out, err)
		}
	}
	if calls.Load() != 0 {
		t.Fatal("fn called for an invalid record")
	}
}

// testEachEpochOnce: a replay epoch (Record.Epoch) is a key space of its
// own: a key recorded under epoch 0 is processed once more under epoch 1,
// then it is a Duplicate under both; a negative epoch is rejected.
func testEachEpochOnce(t *testing.T, s dedupe.Store) {
	ctx := testContext(t)
	rec := record(unique("g"), unique("k"))
	var calls atomic.Int32
	out, err := process(ctx, s, rec, &calls, nil)
	mustOutcome(t, out, err, dedupe.Processed)
	rec.Epoch = 1
	out, err = process(ctx, s, rec, &calls, nil)
	mustOutcome(t, out, err, dedupe.Processed)
	for _, epoch := range []int64{1, 0, 1} {
		rec.Epoch = epoch
		out, err = process(ctx, s, rec, &calls, nil)
		mustOutcome(t, out, err, dedupe.Duplicate)
	}
	if calls.Load() != 2 {
		t.Fatalf("fn called %d times, want 2 (once in epoch 0, once in epoch 1)", calls.Load())
	}
	rec.Epoch = -1
	if out, err := process(ctx, s, rec, &calls, nil); out != 0 || !errors.Is(err, dedupe.ErrInvalidRecord) {
		t.Errorf("Process with Epoch -1 = (%v, %v), want (0, ErrInvalidRecord)", out, err)
	}
}

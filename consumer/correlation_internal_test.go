package consumer

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/correlation"
)

// panicky panics with v; its name must show up in the recovered stack.
func panicky(v any) handler.Handler {
	return handler.Func(func(context.Context, *handler.Message) error { panic(v) })
}

// TestRecovered: a handler's panic becomes a *handler.PanicError with the
// value and the stack of the panicking goroutine (a runtime error and
// panic(nil) too); a result passes through unchanged.
func TestRecovered(t *testing.T) {
	boom := errors.New("boom")
	for _, want := range []error{nil, boom} {
		h := wrap(handler.Func(func(context.Context, *handler.Message) error { return want }))
		if got := h.Handle(context.Background(), &handler.Message{}); got != want {
			t.Fatalf("wrap changed the handler's result: got %v, want %v", got, want)
		}
	}
	for _, tt := range []struct {
		name string
		h    handler.Handler
		is   func(v any) bool
	}{
		{"value", panicky("kaboom"), func(v any) bool { return v == "kaboom" }},
		{"runtime error", handler.Func(func(context.Context, *handler.Message) error {
			var s []int
			s[len(s)] = 1 // index out of range
			return nil
		}), func(v any) bool { _, ok := v.(runtime.Error); return ok }},
		// Since Go 1.21 panic(nil) panics with a *runtime.PanicNilError,
		// so it is still a failure, never mistaken for success.
		{"nil", panicky(nil), func(v any) bool { _, ok := v.(*runtime.PanicNilError); return ok }},
	} {
		err := wrap(tt.h).Handle(context.Background(), &handler.Message{})
		var pe *handler.PanicError
		if !errors.As(err, &pe) || !tt.is(pe.Value) {
			t.Fatalf("%s: err = %T %v, want a *handler.PanicError of the panic's value", tt.name, err, err)
		}
		if !strings.Contains(string(pe.Stack), "goroutine ") || handler.ErrorKind(err) != handler.KindPanic {
			t.Fatalf("%s: kind %q, stack %q", tt.name, handler.ErrorKind(err), pe.Stack)
		}
		if tt.name == "value" && !strings.Contains(string(pe.Stack), "panicky") {
			t.Fatalf("the stack does not show the panicking function:\n%s", pe.Stack)
		}
	}
}

// TestRecoveredInsideTimeout: a panic after a handler.Timeout's deadline
// stays a panic (kind "panic", dead-lettered), never a retriable timeout.
func TestRecoveredInsideTimeout(t *testing.T) {
	h := wrap(handler.Chain(handler.Func(func(ctx context.Context, _ *handler.Message) error {
		<-ctx.Done()
		panic("late")
	}), handler.Timeout(5*time.Millisecond)))
	err := h.Handle(context.Background(), &handler.Message{})
	var pe *handler.PanicError
	if !errors.As(err, &pe) || pe.Value != "late" || handler.ErrorKind(err) != handler.KindPanic || handler.IsRetriable(err) {
		t.Fatalf("err = %v (kind %q); want the panic, kind panic, not retriable", err, handler.ErrorKind(err))
	}
}

// TestCorrelate: the handler's ctx carries the message's correlation id:
// its idem-correlation-id header, else its idempotency key; through a
// worker's slot (set for the call only, no allocation) or, without one, a
// context of its own. A handler's own WithCorrelationID wins.
func TestCorrelate(t *testing.T) {
	var got, inner string
	var kept context.Context
	h := wrap(handler.Func(func(ctx context.Context, m *handler.Message) error {
		got = correlation.From(ctx)
		inner = correlation.From(correlation.With(ctx, "mine"))
		kept = ctx
		return nil
	}))
	withHeader := &handler.Message{IdempotencyKey: "k1", Headers: []handler.Header{{Key: correlation.Header, Value: []byte("corr-1")}}}
	plain := &handler.Message{IdempotencyKey: "k2"}
	slotted := correlation.WithSlot(context.Background())
	for _, tt := range []struct {
		name string
		ctx  context.Context
		m    *handler.Message
		want string
	}{
		{"slot, header", slotted, withHeader, "corr-1"},
		{"slot, key", slotted, plain, "k2"},
		{"no slot, header", context.Background(), withHeader, "corr-1"},
		{"no slot, key", context.Background(), plain, "k2"},
	} {
		if err := h.Handle(tt.ctx, tt.m); err != nil || got != tt.want || inner != "mine" {
			t.Errorf("%s: the handler saw %q (and %q under its own), err %v; want %q", tt.name, got, inner, err, tt.want)
		}
	}
	if id := correlation.From(slotted); id != "" {
		t.Errorf("the slot still says %q after the call", id)
	}
	if id := correlation.From(kept); id != "k2" {
		t.Errorf("a ctx without a slot, kept past the call, says %q", id)
	}

	nop := wrap(handler.Func(func(context.Context, *handler.Message) error { return nil }))
	if n := testing.AllocsPerRun(100, func() { _ = nop.Handle(slotted, plain) }); n != 0 {
		t.Errorf("a call through a worker's slot allocates %.0f times, want 0", n)
	}
}

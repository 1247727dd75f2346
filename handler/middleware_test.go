package handler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
)

// TestPanicError: what a recovered panic's error says of itself: its
// message, its kind ("panic", not retriable), and the panic value as the
// wrapped error when it is one. consumer's TestRecovered makes them from
// real panics.
func TestPanicError(t *testing.T) {
	sentinel := errors.New("sentinel")
	for _, tt := range []struct {
		name      string
		value     any
		wantIs    error // errors.Is(err, wantIs) must hold, if set
		unwrapNil bool  // PanicError.Unwrap returns nil
		wantMsg   string
	}{
		{name: "string", value: "kaboom", unwrapNil: true, wantMsg: "handler panic: kaboom"},
		{name: "int", value: 42, unwrapNil: true, wantMsg: "handler panic: 42"},
		{name: "error", value: sentinel, wantIs: sentinel, wantMsg: "handler panic: sentinel"},
		{name: "wrapped error", value: handler.Permanent(sentinel), wantIs: sentinel},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var err error = &handler.PanicError{Value: tt.value, Stack: []byte("goroutine 1 [running]:")}
			pe := err.(*handler.PanicError)
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Fatalf("errors.Is(err, %v) = false; PanicError must unwrap error values", tt.wantIs)
			}
			if tt.unwrapNil && pe.Unwrap() != nil {
				t.Fatalf("Unwrap() = %v, want nil for a non-error panic value", pe.Unwrap())
			}
			if tt.wantMsg != "" && err.Error() != tt.wantMsg {
				t.Fatalf("Error() = %q, want %q", err.Error(), tt.wantMsg)
			}
			if !isPanic(err) || handler.ErrorKind(err) != handler.KindPanic || handler.IsRetriable(err) {
				t.Fatalf("a *PanicError=%v ErrorKind=%q IsRetriable=%v; want true, panic, false",
					isPanic(err), handler.ErrorKind(err), handler.IsRetriable(err))
			}
		})
	}
}

// waitForCtx returns a handler that signals started, then returns ret(ctx)
// once ctx is done.
func waitForCtx(started chan<- struct{}, ret func(ctx context.Context) error) handler.Handler {
	return handler.Func(func(ctx context.Context, _ *handler.Message) error {
		if started != nil {
			close(started)
		}
		<-ctx.Done()
		return ret(ctx)
	})
}

func TestTimeoutDeadline(t *testing.T) {
	const d = 20 * time.Millisecond
	sentinel := errors.New("downstream said no")
	tests := []struct {
		name     string
		ret      func(ctx context.Context) error
		wantKind handler.Kind
		wantNil  bool
		wantIs   []error
	}{
		{name: "ctx error", ret: func(ctx context.Context) error { return ctx.Err() },
			wantKind: handler.KindTimeout, wantIs: []error{handler.ErrTimeout, context.DeadlineExceeded}},
		{name: "own error", ret: func(context.Context) error { return sentinel },
			wantKind: handler.KindTimeout, wantIs: []error{handler.ErrTimeout, sentinel}},
		{name: "permanent wins over timeout", ret: func(context.Context) error { return handler.Permanent(sentinel) },
			wantKind: handler.KindPermanent, wantIs: []error{handler.ErrTimeout, sentinel}},
		{name: "nil stays nil", ret: func(context.Context) error { return nil }, wantNil: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := handler.Chain(waitForCtx(nil, tt.ret), handler.Timeout(d))
			start := time.Now()
			err := h.Handle(context.Background(), &handler.Message{})
			if el := time.Since(start); el < d {
				t.Fatalf("handler ctx was done after %v, before the %v timeout", el, d)
			}
			if tt.wantNil {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			for _, target := range tt.wantIs {
				if !errors.Is(err, target) {
					t.Fatalf("errors.Is(%v, %v) = false", err, target)
				}
			}
			if k := handler.ErrorKind(err); k != tt.wantKind {
				t.Fatalf("ErrorKind = %q, want %q", k, tt.wantKind)
			}
			if tt.wantKind == handler.KindTimeout && !handler.IsRetriable(err) {
				t.Fatalf("a timeout must be retriable")
			}
			if !strings.Contains(err.Error(), "timeout after "+d.String()) {
				t.Fatalf("Error() = %q, want it to name the timeout %v", err, d)
			}
		})
	}
}

func TestTimeoutNotHit(t *testing.T) {
	boom := errors.New("boom")
	for _, want := range []error{nil, boom} {
		h := handler.Chain(handler.Func(func(ctx context.Context, _ *handler.Message) error {
			dl, ok := ctx.Deadline()
			if !ok || time.Until(dl) > time.Hour {
				t.Errorf("handler ctx deadline = %v, %v; want one at most 1h away", dl, ok)
			}
			return want
		}), handler.Timeout(time.Hour))
		err := h.Handle(context.Background(), &handler.Message{})
		if err != want {
			t.Fatalf("err = %v, want %v unchanged", err, want)
		}
		if errors.Is(err, handler.ErrTimeout) {
			t.Fatalf("an error returned in time must not be a timeout")
		}
	}
}

func TestTimeoutParentCancelIsNotTimeout(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started := make(chan struct{})
		done := make(chan error, 1)
		h := handler.Chain(waitForCtx(started, func(ctx context.Context) error { return ctx.Err() }), handler.Timeout(time.Hour))
		go func() { done <- h.Handle(ctx, &handler.Message{}) }()
		<-started
		cancel() // the partition was revoked
		err := <-done
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if errors.Is(err, handler.ErrTimeout) || handler.ErrorKind(err) == handler.KindTimeout {
			t.Fatalf("parent cancellation reported as a timeout: %v (kind %q)", err, handler.ErrorKind(err))
		}
	})
	t.Run("parent deadline first", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		h := handler.Chain(waitForCtx(nil, func(ctx context.Context) error { return ctx.Err() }), handler.Timeout(time.Hour))
		err := h.Handle(ctx, &handler.Message{})
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, handler.ErrTimeout) {
			t.Fatalf("err = %v; want the parent's DeadlineExceeded, not ErrTimeout", err)
		}
	})
}

func TestTimeoutDisabled(t *testing.T) {
	boom := errors.New("boom")
	for _, d := range []time.Duration{0, -time.Second} {
		h := handler.Chain(handler.Func(func(ctx context.Context, _ *handler.Message) error {
			if _, ok := ctx.Deadline(); ok {
				t.Errorf("Timeout(%v) set a deadline; d <= 0 must disable it", d)
			}
			return boom
		}), handler.Timeout(d))
		if err := h.Handle(context.Background(), &handler.Message{}); err != boom {
			t.Fatalf("Timeout(%v): err = %v, want %v unchanged", d, err, boom)
		}
	}
}

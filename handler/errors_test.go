package handler_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
)

// isPanic reports whether err is or wraps a *handler.PanicError.
func isPanic(err error) bool { return errors.As(err, new(*handler.PanicError)) }

func TestNilInputsReturnNil(t *testing.T) {
	if err := handler.Permanent(nil); err != nil {
		t.Errorf("Permanent(nil) = %v, want nil", err)
	}
	if err := handler.Decode(nil); err != nil {
		t.Errorf("Decode(nil) = %v, want nil", err)
	}
	if err := handler.RetryAfter(nil, time.Second); err != nil {
		t.Errorf("RetryAfter(nil, 1s) = %v, want nil", err)
	}
	if k := handler.ErrorKind(nil); k != "" {
		t.Errorf(`ErrorKind(nil) = %q, want ""`, k)
	}
	if handler.IsRetriable(nil) || handler.IsPermanent(nil) || handler.IsDecode(nil) || isPanic(nil) {
		t.Errorf("a nil error must be neither retriable, permanent, decode nor panic")
	}
	if d, ok := handler.RetryAfterOf(nil); ok || d != 0 {
		t.Errorf("RetryAfterOf(nil) = %v, %v; want 0, false", d, ok)
	}
	if err := wire.Cause(nil); err != nil {
		t.Errorf("Cause(nil) = %v, want nil", err)
	}
}

// timedOut returns the error Timeout produces when the handler returns err
// after the deadline.
func timedOut(err error) error {
	h := handler.Chain(handler.Func(func(ctx context.Context, _ *handler.Message) error {
		<-ctx.Done()
		return err
	}), handler.Timeout(time.Millisecond))
	return h.Handle(context.Background(), &handler.Message{})
}

func TestClassification(t *testing.T) {
	base := errors.New("base")
	panicErr := &handler.PanicError{Value: base}
	missing := &handler.MissingKeyError{Reason: "empty"}
	tests := []struct {
		name      string
		err       error
		kind      handler.Kind
		permanent bool
		decode    bool
		panicked  bool
	}{
		{"plain", base, handler.KindRetriable, false, false, false},
		{"wrapped plain", fmt.Errorf("charge: %w", base), handler.KindRetriable, false, false, false},
		{"context canceled", context.Canceled, handler.KindRetriable, false, false, false},
		{"context deadline", context.DeadlineExceeded, handler.KindRetriable, false, false, false},
		{"retry after", handler.RetryAfter(base, time.Second), handler.KindRetriable, false, false, false},
		{"permanent", handler.Permanent(base), handler.KindPermanent, true, false, false},
		{"wrapped permanent", fmt.Errorf("ctx: %w", handler.Permanent(base)), handler.KindPermanent, true, false, false},
		{"permanent retry after", handler.Permanent(handler.RetryAfter(base, time.Second)), handler.KindPermanent, true, false, false},
		{"retry after permanent", handler.RetryAfter(handler.Permanent(base), time.Second), handler.KindPermanent, true, false, false},
		{"decode", handler.Decode(base), handler.KindDecode, true, true, false},
		{"wrapped decode", fmt.Errorf("ctx: %w", handler.Decode(base)), handler.KindDecode, true, true, false},
		{"decode beats permanent", handler.Permanent(handler.Decode(base)), handler.KindDecode, true, true, false},
		{"permanent around decode", handler.Decode(handler.Permanent(base)), handler.KindDecode, true, true, false},
		{"timeout", timedOut(base), handler.KindTimeout, false, false, false},
		{"wrapped timeout", fmt.Errorf("x: %w", handler.ErrTimeout), handler.KindTimeout, false, false, false},
		{"permanent beats timeout", timedOut(handler.Permanent(base)), handler.KindPermanent, true, false, false},
		{"decode beats timeout", timedOut(handler.Decode(base)), handler.KindDecode, true, true, false},
		{"panic", panicErr, handler.KindPanic, false, false, true},
		{"panic beats decode", &handler.PanicError{Value: handler.Decode(base)}, handler.KindPanic, true, true, true},
		{"panic beats permanent", &handler.PanicError{Value: handler.Permanent(base)}, handler.KindPanic, true, false, true},
		{"panic beats timeout", timedOut(panicErr), handler.KindPanic, false, false, true},
		{"missing key", missing, handler.KindMissingKey, false, false, false},
		{"wrapped missing key", fmt.Errorf("x: %w", missing), handler.KindMissingKey, false, false, false},
		{"missing key beats panic", errors.Join(panicErr, missing), handler.KindMissingKey, false, false, true},
		{"missing key beats permanent", handler.Permanent(missing), handler.KindMissingKey, true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := handler.ErrorKind(tt.err); got != tt.kind {
				t.Errorf("ErrorKind = %q, want %q", got, tt.kind)
			}
			if got := handler.IsPermanent(tt.err); got != tt.permanent {
				t.Errorf("IsPermanent = %v, want %v", got, tt.permanent)
			}
			if got := handler.IsDecode(tt.err); got != tt.decode {
				t.Errorf("IsDecode = %v, want %v", got, tt.decode)
			}
			if got := isPanic(tt.err); got != tt.panicked {
				t.Errorf("IsPanic = %v, want %v", got, tt.panicked)
			}
			wantRetriable := tt.kind == handler.KindRetriable || tt.kind == handler.KindTimeout
			if got := handler.IsRetriable(tt.err); got != wantRetriable {
				t.Errorf("IsRetriable = %v, want %v (kind %q)", got, wantRetriable, tt.kind)
			}
			if !errors.Is(tt.err, base) && tt.kind != handler.KindMissingKey &&
				tt.name != "context canceled" && tt.name != "context deadline" && tt.name != "wrapped timeout" {
				t.Errorf("errors.Is(err, base) = false: the wrapper lost its cause")
			}
		})
	}
}

func TestWrappersKeepMessageAndCause(t *testing.T) {
	base := io.ErrUnexpectedEOF
	tests := []struct {
		name    string
		err     error
		wantMsg string
	}{
		{"permanent", handler.Permanent(base), base.Error()},
		{"decode", handler.Decode(base), "decode: " + base.Error()},
		{"retry after", handler.RetryAfter(base, 2*time.Second), base.Error() + " (retry after 2s)"},
		{"missing key", &handler.MissingKeyError{Reason: "empty"}, "handler: missing idempotency key: empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.wantMsg {
				t.Errorf("Error() = %q, want %q", got, tt.wantMsg)
			}
			if tt.name != "missing key" && !errors.Is(tt.err, base) {
				t.Errorf("errors.Is(%v, io.ErrUnexpectedEOF) = false", tt.err)
			}
		})
	}
}

func TestRetryAfterOf(t *testing.T) {
	base := errors.New("rate limited")
	tests := []struct {
		name   string
		err    error
		want   time.Duration
		wantOK bool
	}{
		{"plain", base, 0, false},
		{"direct", handler.RetryAfter(base, 3*time.Second), 3 * time.Second, true},
		{"zero delay", handler.RetryAfter(base, 0), 0, true},
		{"wrapped", fmt.Errorf("call bank: %w", handler.RetryAfter(base, time.Minute)), time.Minute, true},
		{"inside permanent", handler.Permanent(handler.RetryAfter(base, time.Second)), time.Second, true},
		{"outermost wins", handler.RetryAfter(handler.RetryAfter(base, time.Second), time.Hour), time.Hour, true},
		{"joined", errors.Join(base, handler.RetryAfter(base, 5*time.Second)), 5 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := handler.RetryAfterOf(tt.err)
			if d != tt.want || ok != tt.wantOK {
				t.Fatalf("RetryAfterOf = %v, %v; want %v, %v", d, ok, tt.want, tt.wantOK)
			}
		})
	}
	var ra *handler.RetryAfterError
	if err := handler.RetryAfter(base, time.Second); !errors.As(err, &ra) || ra.Err != base || ra.After != time.Second {
		t.Fatalf("errors.As(*RetryAfterError) = %+v, want {Err: base, After: 1s}", ra)
	}
}

// TestCause: handler's own marks give way to the error they mark
// (internal/wire.Cause, the idem-error-type header); a user's wrapper and
// a panic do not.
func TestCause(t *testing.T) {
	base := io.ErrUnexpectedEOF
	userWrap := fmt.Errorf("charge: %w", base)
	panicErr := &handler.PanicError{Value: "boom"}
	tests := []struct {
		name string
		err  error
		want error
	}{
		{"plain", base, base},
		{"user wrapper is kept", userWrap, userWrap},
		{"permanent", handler.Permanent(base), base},
		{"decode", handler.Decode(base), base},
		{"retry after", handler.RetryAfter(base, time.Second), base},
		{"stacked", handler.Permanent(handler.RetryAfter(handler.Decode(userWrap), time.Second)), userWrap},
		{"timeout", timedOut(base), base},
		{"timeout of permanent", timedOut(handler.Permanent(base)), base},
		{"panic is its own cause", panicErr, panicErr},
		{"missing key", &handler.MissingKeyError{Reason: "x"}, nil /* itself, checked below */},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == nil {
				want = tt.err
			}
			if got := wire.Cause(tt.err); got != want {
				t.Fatalf("Cause = %T %v, want %T %v", got, got, want, want)
			}
		})
	}
}

// apiError is an HTTP client's own error type with an HTTPStatus method.
type apiError struct{ code int }

func (e apiError) Error() string   { return fmt.Sprintf("api: status %d", e.code) }
func (e apiError) HTTPStatus() int { return e.code }

func TestHTTPStatus(t *testing.T) {
	if err := handler.HTTPStatus(nil, 500); err != nil {
		t.Fatalf("HTTPStatus(nil, 500) = %v, want nil", err)
	}
	if code, ok := wire.HTTPStatusOf(nil); ok || code != 0 {
		t.Fatalf("HTTPStatusOf(nil) = %d, %v; want 0, false", code, ok)
	}
	base := errors.New("bank: declined")
	err := fmt.Errorf("charge: %w", handler.Permanent(handler.HTTPStatus(base, 422)))
	if code, ok := wire.HTTPStatusOf(err); !ok || code != 422 {
		t.Fatalf("HTTPStatusOf = %d, %v; want 422, true", code, ok)
	}
	if !errors.Is(err, base) || !handler.IsPermanent(err) || handler.ErrorKind(err) != handler.KindPermanent {
		t.Fatalf("the status hides the chain: Is %v, IsPermanent %v, kind %s", errors.Is(err, base), handler.IsPermanent(err), handler.ErrorKind(err))
	}
	if got := wire.Cause(handler.Permanent(handler.HTTPStatus(base, 422))); got != base {
		t.Fatalf("Cause = %v, want the bank's error", got)
	}
	if got := handler.HTTPStatus(base, 503).Error(); got != "bank: declined (HTTP 503)" {
		t.Fatalf("Error() = %q", got)
	}
	if handler.ErrorKind(handler.HTTPStatus(base, 503)) != handler.KindRetriable {
		t.Fatal("a status alone must not change the kind")
	}
	// A client's own type is found through its method.
	if code, ok := wire.HTTPStatusOf(fmt.Errorf("x: %w", apiError{409})); !ok || code != 409 {
		t.Fatalf("HTTPStatusOf(apiError) = %d, %v; want 409, true", code, ok)
	}
	if _, ok := wire.HTTPStatusOf(base); ok {
		t.Fatal("HTTPStatusOf of a plain error reports a status")
	}
}

package handler_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/idemhq/idem/handler"
)

// record returns a middleware that appends name to *trace before and
// name+"/after" after calling the next handler.
func record(trace *[]string, name string) handler.Middleware {
	return func(next handler.Handler) handler.Handler {
		return handler.Func(func(ctx context.Context, m *handler.Message) error {
			*trace = append(*trace, name)
			err := next.Handle(ctx, m)
			*trace = append(*trace, name+"/after")
			return err
		})
	}
}

func TestChainOrder(t *testing.T) {
	tests := []struct {
		name string
		mws  []string
		want []string
	}{
		{"none", nil, []string{"h"}},
		{"one", []string{"a"}, []string{"a", "h", "a/after"}},
		{"first listed is outermost", []string{"a", "b", "c"},
			[]string{"a", "b", "c", "h", "c/after", "b/after", "a/after"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var trace []string
			h := handler.Func(func(ctx context.Context, m *handler.Message) error {
				trace = append(trace, "h")
				return nil
			})
			var mws []handler.Middleware
			for _, n := range tt.mws {
				mws = append(mws, record(&trace, n))
			}
			if err := handler.Chain(h, mws...).Handle(context.Background(), &handler.Message{}); err != nil {
				t.Fatalf("Handle = %v, want nil", err)
			}
			if !slices.Equal(trace, tt.want) {
				t.Fatalf("calls = %v, want %v", trace, tt.want)
			}
		})
	}
}

func TestChainPassesErrorOut(t *testing.T) {
	boom := errors.New("boom")
	var trace []string
	h := handler.Chain(handler.Func(func(context.Context, *handler.Message) error { return boom }),
		record(&trace, "a"), record(&trace, "b"))
	if err := h.Handle(context.Background(), &handler.Message{}); !errors.Is(err, boom) {
		t.Fatalf("Handle = %v, want %v", err, boom)
	}
}

func TestFunc(t *testing.T) {
	type ctxKey struct{}
	ctx := context.WithValue(context.Background(), ctxKey{}, "v")
	msg := &handler.Message{Topic: "t", Offset: 7}
	want := errors.New("from func")
	var gotCtx context.Context
	var gotMsg *handler.Message
	f := handler.Func(func(ctx context.Context, m *handler.Message) error {
		gotCtx, gotMsg = ctx, m
		return want
	})
	var h handler.Handler = f
	if err := h.Handle(ctx, msg); err != want {
		t.Fatalf("Handle = %v, want %v", err, want)
	}
	if gotCtx.Value(ctxKey{}) != "v" || gotMsg != msg {
		t.Fatalf("Func did not receive the ctx and message it was called with")
	}
}

func TestMessageHeader(t *testing.T) {
	m := &handler.Message{Headers: []handler.Header{
		{Key: "a", Value: []byte("1")},
		{Key: "idempotency-key", Value: []byte("first")},
		{Key: "empty", Value: nil},
		{Key: "idempotency-key", Value: []byte("last")},
	}}
	tests := []struct {
		key    string
		want   string
		wantOK bool
	}{
		{"a", "1", true},
		{"idempotency-key", "last", true}, // last wins
		{"empty", "", true},               // present with a nil value
		{"missing", "", false},
		{"A", "", false}, // keys are case-sensitive
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			v, ok := m.Header(tt.key)
			if ok != tt.wantOK || string(v) != tt.want {
				t.Fatalf("Header(%q) = %q, %v; want %q, %v", tt.key, v, ok, tt.want, tt.wantOK)
			}
		})
	}
	if v, ok := (&handler.Message{}).Header("x"); ok || v != nil {
		t.Fatalf("Header on a message without headers = %q, %v; want nil, false", v, ok)
	}
}

// TestBatchHandleErrorNamingNoneOfItsMessagesFails: a *BatchError that does
// not name the one message Handle passed (it names a copy, another message,
// or nothing) is a failure of that message, never a success: returning nil
// would commit the message's inbox row with no effect.
func TestBatchHandleErrorNamingNoneOfItsMessagesFails(t *testing.T) {
	cause := errors.New("bank down")
	for name, be := range map[string]func(m *handler.Message) *handler.BatchError{
		"a copy": func(m *handler.Message) *handler.BatchError { c := *m; return (&handler.BatchError{}).Add(&c, cause) },
		"another": func(*handler.Message) *handler.BatchError {
			return (&handler.BatchError{}).Add(&handler.Message{Offset: 9}, cause)
		},
		"nothing": func(*handler.Message) *handler.BatchError { return &handler.BatchError{} },
	} {
		t.Run(name, func(t *testing.T) {
			h := handler.Batch(func(_ context.Context, ms []*handler.Message) error { return be(ms[0]) })
			err := h.Handle(context.Background(), &handler.Message{Topic: "t", Offset: 3})
			if err == nil {
				t.Fatal("Handle returned nil for a *BatchError that names none of its messages")
			}
			if !errors.As(err, new(*handler.BatchError)) {
				t.Errorf("error %v does not wrap the batch's *BatchError", err)
			}
		})
	}
	// The message it names keeps its own error.
	h := handler.Batch(func(_ context.Context, ms []*handler.Message) error {
		return (&handler.BatchError{}).Add(ms[0], handler.Permanent(cause))
	})
	if _, ok := h.(handler.BatchHandler); !ok {
		t.Fatalf("Batch's Handler %T is not a BatchHandler: Run would not batch it", h)
	}
	if handler.Batch(nil) != nil {
		t.Fatal("Batch(nil) is not nil: Run could not refuse it as a nil handler")
	}
	if err := h.Handle(context.Background(), &handler.Message{}); !handler.IsPermanent(err) || !errors.Is(err, cause) {
		t.Fatalf("Handle: %v, want the named message's permanent error", err)
	}
}

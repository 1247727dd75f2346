package handler_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemhq/idem/handler"
)

// logging is a middleware that prints around the handler it wraps.
func logging(name string) handler.Middleware {
	return func(next handler.Handler) handler.Handler {
		return handler.Func(func(ctx context.Context, m *handler.Message) error {
			fmt.Println(name, "before")
			err := next.Handle(ctx, m)
			fmt.Println(name, "after:", err)
			return err
		})
	}
}

// The first middleware listed is the outermost: it runs first and sees the
// final error last.
func ExampleChain() {
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		fmt.Println("handle offset", m.Offset)
		return nil
	})
	chained := handler.Chain(h,
		logging("outer"),
		logging("inner"),
		handler.Timeout(30*time.Second),
	)
	_ = chained.Handle(context.Background(), &handler.Message{Topic: "payments", Offset: 42})
	// Output:
	// outer before
	// inner before
	// handle offset 42
	// inner after: <nil>
	// outer after: <nil>
}

// A payload that can never succeed is marked Permanent (or Decode, for bytes
// that do not parse): idem sends it to the dead-letter topic at once instead of
// retrying it.
func ExamplePermanent() {
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		amount, err := strconv.Atoi(string(m.Value))
		if err != nil {
			return handler.Decode(fmt.Errorf("amount: %w", err))
		}
		if amount <= 0 {
			return handler.Permanent(fmt.Errorf("amount %d: must be positive", amount))
		}
		return nil
	})
	for _, v := range []string{"100", "-5", "abc"} {
		err := h.Handle(context.Background(), &handler.Message{Value: []byte(v)})
		fmt.Printf("%-4s kind=%q permanent=%v retriable=%v\n",
			v, handler.ErrorKind(err), handler.IsPermanent(err), handler.IsRetriable(err))
	}
	// Output:
	// 100  kind="" permanent=false retriable=false
	// -5   kind="permanent" permanent=true retriable=false
	// abc  kind="decode" permanent=true retriable=false
}

// A dependency that says "try again in 30s" (HTTP 429 with Retry-After) is
// reported with RetryAfter: the message stays retriable, and neither the next
// in-process retry nor a retry tier handles it sooner than asked.
func ExampleRetryAfter() {
	errRateLimited := errors.New("bank: 429 too many requests")
	err := fmt.Errorf("charge %s: %w", "order-17", handler.RetryAfter(errRateLimited, 30*time.Second))

	d, ok := handler.RetryAfterOf(err)
	fmt.Println(d, ok)
	fmt.Println(handler.IsRetriable(err), handler.ErrorKind(err))
	fmt.Println(errors.Is(err, errRateLimited))
	// Output:
	// 30s true
	// true retriable
	// true
}

// Timeout bounds one call of the handler. Running out of time is retriable
// and reported with errors.Is(err, ErrTimeout).
func ExampleTimeout() {
	slow := handler.Func(func(ctx context.Context, m *handler.Message) error {
		select {
		case <-time.After(time.Minute): // a slow call that honours ctx
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	err := handler.Chain(slow, handler.Timeout(10*time.Millisecond)).Handle(context.Background(), &handler.Message{})
	fmt.Println(errors.Is(err, handler.ErrTimeout), handler.ErrorKind(err), handler.IsRetriable(err))
	// Output:
	// true timeout true
}

// Header returns the last header with the name, as Kafka clients append
// rather than replace.
func ExampleMessage_Header() {
	m := &handler.Message{Headers: []handler.Header{
		{Key: "idempotency-key", Value: []byte("old")},
		{Key: "idempotency-key", Value: []byte("new")},
	}}
	v, ok := m.Header("idempotency-key")
	fmt.Println(string(v), ok)
	_, ok = m.Header("trace-id")
	fmt.Println(ok)
	// Output:
	// new true
	// false
}

// A handler defers a message it may not act on yet; the consumer stores it
// and delivers it again at that time, without holding the partition.
func ExampleDeferUntil() {
	opens := time.Now().Add(24 * time.Hour) // the settlement window
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if time.Now().Before(opens) {
			return handler.DeferUntil(opens)
		}
		return nil // settle the payment
	})
	err := h.Handle(context.Background(), &handler.Message{Topic: "settlements"})
	until, deferred := handler.DeferredUntil(err)
	fmt.Println(deferred, until.Equal(opens))
	// Output: true true
}

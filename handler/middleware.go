package handler

import (
	"context"
	"errors"
	"time"
)

// Timeout bounds each call of the wrapped handler to d. When the deadline passes
// the handler's ctx is cancelled; if the handler then returns an error, it is
// wrapped so that errors.Is(err, ErrTimeout) holds and its kind is "timeout"
// (retriable). d <= 0 disables the bound.
func Timeout(d time.Duration) Middleware {
	return func(next Handler) Handler {
		if d <= 0 {
			return next
		}
		return Func(func(ctx context.Context, m *Message) error {
			tctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			err := next.Handle(tctx, m)
			if err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded) {
				return &timeoutError{d: d, err: err}
			}
			return err
		})
	}
}

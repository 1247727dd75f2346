package forward

import (
	"context"
	"time"
)

// WaitDue blocks until now() is at or after due, or ctx is done. It returns
// nil once due has passed and ctx.Err() as soon as ctx is cancelled (also when
// ctx is already cancelled on entry, even if due has passed). It never returns
// nil early: it sleeps on a timer and re-reads now() each time the timer
// fires, so a clock that lags only makes it wait longer. now defaults to
// time.Now.
//
// A record read from a retry tier is handed to the handler only after
// WaitDue(ctx, failure.DueAt, now) returns nil.
func WaitDue(ctx context.Context, due time.Time, now func() time.Time) error {
	if now == nil {
		now = time.Now
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		d := due.Sub(now())
		if d <= 0 {
			return nil
		}
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

package consumer

import (
	"context"
	"time"
)

// WithLagClock returns ctx carrying a clock for Run's lag watcher: the time
// it compares retry tiers' and deferred messages' due times with (a test
// moves it forward instead of waiting ten minutes).
func WithLagClock(ctx context.Context, now func() time.Time) context.Context {
	h := *hooks(ctx)
	h.lagNow = now
	return context.WithValue(ctx, testHooksKey{}, &h)
}

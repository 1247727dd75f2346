package consumer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
)

// BatchConfig.MaxLatency: a worker whose handler takes 2 ms a message gets
// batches of about MaxLatency / 2 ms; a fast handler keeps MaxMessages; no
// budget keeps MaxMessages whatever the handler's time.
func TestBatchLimitFollowsHandlerTime(t *testing.T) {
	for _, tt := range []struct {
		name    string
		latency time.Duration
		cost    time.Duration
		want    int
	}{
		{"no history", 50 * time.Millisecond, 0, 500},
		{"slow handler", 50 * time.Millisecond, 2 * time.Millisecond, 25},
		{"fast handler", 50 * time.Millisecond, 10 * time.Microsecond, 500},
		{"slower than the budget", 50 * time.Millisecond, time.Second, 1},
		{"no budget", -1, time.Second, 500},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := batch{&worker{claim: &claim{r: &runner{}}}}
			for range 20 {
				p.costed(tt.cost*10, 10)
			}
			if got := p.batchLimit(BatchConfig{MaxMessages: 500, MaxLatency: tt.latency}); got != tt.want {
				t.Fatalf("batchLimit = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestBatchHandlerDefaults: Run recognises a handler.Batch handler, whose
// Batch.MaxMessages left 0 is 500 (documented on BatchConfig.MaxMessages);
// any other handler keeps 0 (off), and an explicit value is kept.
func TestBatchHandlerDefaults(t *testing.T) {
	one := handler.Func(func(context.Context, *handler.Message) error { return nil })
	many := handler.Batch(func(context.Context, []*handler.Message) error { return nil })
	for _, tt := range []struct {
		name      string
		h         handler.Handler
		set, want int
		batch     bool
	}{
		{"per-message handler", one, 0, 0, false},
		{"batch handler", many, 0, 500, true},
		{"batch handler, one per transaction", many, 1, 1, true},
		{"batch handler, 50", many, 50, 50, true},
		{"per-message handler, 50", one, 50, 50, false},
	} {
		cfg, bh := forHandler(Config{Batch: BatchConfig{MaxMessages: tt.set}}, tt.h)
		if cfg.Batch.MaxMessages != tt.want || (bh != nil) != tt.batch {
			t.Errorf("%s: MaxMessages %d, batch handler %v; want %d, %v", tt.name, cfg.Batch.MaxMessages, bh != nil, tt.want, tt.batch)
		}
	}
	if err := Run(context.Background(), Config{}, handler.Batch(nil)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "handler") {
		t.Errorf("Run(handler.Batch(nil)) = %v, want ErrInvalidConfig naming the handler", err)
	}
}

package consumer

import (
	"testing"
	"time"
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
			p := batch{&worker{claim: &claim{r: &runner{cfg: Config{Batch: BatchConfig{MaxMessages: 500, MaxLatency: tt.latency}}}}}}
			for range 20 {
				p.costed(tt.cost*10, 10)
			}
			if got := p.batchLimit(); got != tt.want {
				t.Fatalf("batchLimit = %d, want %d", got, tt.want)
			}
		})
	}
}

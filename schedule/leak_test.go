package schedule_test

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

// TestSchedulerLeavesNoGoroutines: every goroutine Scheduler.Run starts
// (Kafka client, producer, per-round senders) has ended when Run returns.
// Not parallel, so no other test of the package starts goroutines meanwhile.
func TestSchedulerLeavesNoGoroutines(t *testing.T) {
	e := newEnv(t, 1)
	col := e.collect()
	before := goleak.IgnoreCurrent()
	s, _ := e.scheduler()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	e.deferAll(e.dbNow(), e.record(1))
	col.waitKeys(t, 1)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	goleak.VerifyNone(t, before,
		// sarama's go-metrics arbiter: one per process, never stopped (see consumer/leak_test.go).
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

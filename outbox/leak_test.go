package outbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestRelayLeavesNoGoroutines: every goroutine Relay.Run starts (producer,
// per-round sender, connection watchers) has ended when Run returns. Not
// parallel, so no other test of the package starts goroutines meanwhile.
func TestRelayLeavesNoGoroutines(t *testing.T) {
	e := newEnv(t, 1)
	recs := e.consume(e.topic)
	e.enqueue(e.msg("a", "1"))
	before := goleak.IgnoreCurrent()
	r, _ := e.relay(e.pool)
	stop := start(t, r)
	recs.waitKeys(t, "a")
	stop()
	goleak.VerifyNone(t, before,
		// sarama's go-metrics arbiter: one per process, never stopped (see consumer/leak_test.go).
		goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick"))
}

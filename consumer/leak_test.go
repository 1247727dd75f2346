package consumer_test

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestRunLeavesNoGoroutines checks "no goroutine outlives Run": every
// goroutine Run starts (sarama clients, consumer group, producer, partition
// workers, readers, grace timers) has ended when Run returns.
//
// It is deliberately not parallel: Go runs the parallel tests of a package
// only after every sequential one has finished, so while this test runs no
// other test starts goroutines, and the snapshot taken by IgnoreCurrent (after
// the test's own broker and database clients exist) separates what Run starts
// from everything else.
func TestRunLeavesNoGoroutines(t *testing.T) {
	e := newEnv(t, 3)
	keys := coreKeys("leak", 60)
	e.produce(keys, 3)
	// Warm the helpers used while Run is running so their lazily started
	// goroutines predate the snapshot.
	_ = e.count(`SELECT count(*) FROM effects`)

	before := goleak.IgnoreCurrent()
	r := start(t, e.config(), effectHandler())
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects`); n < len(keys) {
			return fmt.Errorf("effects %d of %d", n, len(keys))
		}
		return nil
	})
	if err := r.stop(); err != nil {
		t.Fatalf("Run = %v", err)
	}
	goleak.VerifyNone(t, before, goMetricsArbiter)

	// Run committed what it finished before it returned.
	e.waitCommitted(e.topic, 3, 30*time.Second)
}

// goMetricsArbiter ignores the one goroutine sarama's dependency
// github.com/rcrowley/go-metrics starts and never stops: the process-wide
// meter arbiter. The first go-metrics Meter created in a process (sarama
// creates meters for every broker connection, producer and consumer unless
// metrics.UseNilMetrics is set) starts `go arbiter.tick()`, an endless loop on
// a package-level ticker with no stop function. It is a singleton, not per
// client, so it does not grow with Run calls; it is not Run's goroutine and
// Run cannot end it. In this test it normally predates the snapshot (the test
// harness's admin client and producer have already created meters), so the
// option only matters when Run is the first sarama user of the process.
var goMetricsArbiter = goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")

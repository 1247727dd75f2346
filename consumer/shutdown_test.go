package consumer_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
)

// Run is cancelled when about half the stream has effects. The offsets
// committed at shutdown are exactly those of the finished messages (each
// partition's effects are offsets [0, committed)); the restarted consumer
// completes the stream without a gap and without a double effect.
func TestGracefulShutdownMidStreamThenRestart(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		const partitions, total = 4, 1200
		e := newEnv(t, partitions).in(mode)
		e.produce(coreKeys("graceful", total), partitions)

		gate := coreNewTokens()
		t.Cleanup(gate.open)
		reg1 := prometheus.NewRegistry()
		cfg := e.config()
		cfg.Registerer = reg1
		cfg.CommitInterval = time.Hour // only the shutdown commits
		r1 := start(t, cfg, coreGatedHandler(gate))

		gate.release(total / 2)
		e.coreWaitProgress(gate, total/2, 60*time.Second)
		// Every partition now has a handler waiting for a token. Cancel, then let
		// the in-flight ones finish within the grace period.
		r1.cancel()
		gate.release(partitions)
		if err := r1.stop(); err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}

		done := e.count(`SELECT count(*) FROM effects`)
		committed := e.committed(e.topic, partitions)
		t.Logf("at shutdown: effects %d, committed %v", done, committed)
		if done >= total {
			t.Fatalf("the stream completed before the shutdown (effects %d): not mid-stream", done)
		}
		// With lanes, messages above the lowest unfinished one may have finished
		// too: their offsets are not committed (the restart sees them again as
		// duplicates), but below the committed offset there is never a gap.
		lanes := strings.Contains(string(mode), "lanes")
		sum := int64(0)
		for p := range int32(partitions) {
			c := max(committed[p], 0)
			sum += c
			n := e.count(`SELECT count(*) FROM effects WHERE part = $1`, p)
			inRange := e.count(`SELECT count(*) FROM effects WHERE part = $1 AND off < $2`, p, c)
			if int64(inRange) != c || (!lanes && inRange != n) {
				t.Errorf("partition %d: committed %d but has %d effects (%d below the committed offset); want effects for exactly offsets [0,%d)", p, c, n, inRange, c)
			}
		}
		if !lanes && sum != int64(done) {
			t.Errorf("committed offsets sum to %d, effects %d: finished messages were not committed at shutdown (or a gap was)", sum, done)
		}

		reg2 := prometheus.NewRegistry()
		cfg2 := e.config()
		cfg2.Registerer = reg2
		gate.open()
		start(t, cfg2, coreGatedHandler(gate))
		e.waitCommitted(e.topic, partitions, 90*time.Second)
		e.coreAssertOnePerKey(total)
		if got := coreOutcome(t, reg2, coremetrics.OutcomeProcessed); got != total-done {
			t.Errorf("after restart processed = %d, want %d", got, total-done)
		}
		// With lanes the finished messages above the committed offset come back
		// as duplicates; without, the shutdown committed every finished message.
		wantDup := 0
		if lanes {
			wantDup = done - int(sum)
		}
		if got := coreOutcome(t, reg2, coremetrics.OutcomeDuplicate); got != wantDup {
			t.Errorf("after restart duplicates = %d, want %d (finished messages above the committed offsets)", got, wantDup)
		}
	})
}

// TestShutdownGraceCancelsInFlight: a handler still running ShutdownGrace
// after Run's ctx is cancelled has its ctx cancelled; its transaction rolls
// back, its offset is not committed (the finished message before it is), Run
// returns nil, and the restarted consumer handles the message.
func TestShutdownGraceCancelsInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce([]string{"g-0", "g-1", "g-2"}, 1)

	entered := make(chan struct{})
	var once sync.Once
	eff := effectHandler()
	stuck := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey != "g-1" {
			return eff(ctx, m)
		}
		// Write the effect, then hang until idem gives up on us.
		if err := eff(ctx, m); err != nil {
			return err
		}
		once.Do(func() { close(entered) })
		<-ctx.Done()
		return ctx.Err()
	})
	cfg := e.config()
	cfg.ShutdownGrace = 300 * time.Millisecond
	r := start(t, cfg, stuck)
	select {
	case <-entered:
	case <-time.After(60 * time.Second):
		t.Fatal("the handler never reached g-1")
	}
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for stop in Cleanup
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its ctx was cancelled and the grace period passed")
	}
	if got := e.count(`SELECT count(*) FROM effects`); got != 1 {
		t.Errorf("effects = %d, want 1 (g-1's transaction must roll back)", got)
	}
	if got := e.count(`SELECT count(*) FROM idem_processed WHERE idempotency_key = 'g-1'`); got != 0 {
		t.Errorf("inbox rows for g-1 = %d, want 0", got)
	}
	if c := e.committed(e.topic, 1)[0]; c != 1 {
		t.Errorf("committed offset = %d, want 1 (g-0 finished, g-1 cancelled)", c)
	}
	if v := metricValue(t, e, "idem_abandoned_total", nil); v != 1 {
		t.Errorf("idem_abandoned_total = %v, want 1", v)
	}

	start(t, e.config(), effectHandler())
	e.waitCommitted(e.topic, 1, 60*time.Second)
	e.coreAssertOnePerKey(3)
}

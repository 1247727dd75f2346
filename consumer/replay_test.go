package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// Issue 4, test 7 (library side; the CLI's own end-to-end test is in
// cmd/idem): replaying DLQ records through a running consumer applies the ones
// never applied, is a no-op for those whose effects already happened, and a
// second replay replays nothing.
func TestReplayIsIdempotent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	cfg := e.config()
	cfg.DLQDepthInterval = 100 * time.Millisecond
	var fixed atomic.Bool
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if !fixed.Load() {
			return handler.Permanent(errors.New("bug in the handler"))
		}
		return effectHandler()(ctx, m)
	})
	e.produce([]string{"k1", "k2", "k3"}, 2)
	start(t, cfg, h)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.total(e.dlq(), 2); n != 3 {
			return fmt.Errorf("DLQ has %d of 3", n)
		}
		return nil
	})
	// The bug is fixed; the producer re-sends k1 itself, so its effect happens
	// before the replay.
	fixed.Store(true)
	e.produce([]string{"k1"}, 2)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects`); n != 1 {
			return fmt.Errorf("%d effects", n)
		}
		return nil
	})
	c, err := dlq.Open(e.k.Brokers, e.k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := testenv.Context(t)
	res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: e.dlq()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 3 {
		t.Fatalf("replayed %d, want 3", res.Replayed)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects`); n != 3 {
			return fmt.Errorf("%d effects", n)
		}
		return nil
	})
	e.waitCommitted(e.topic, 2, 30*time.Second)
	if n := e.count(`SELECT count(*) FROM effects WHERE key='k1'`); n != 1 {
		t.Fatalf("k1 has %d effects after the replay, want 1", n)
	}
	if v := metricValue(t, e, "idem_messages_total", map[string]string{"outcome": "duplicate"}); v < 1 {
		t.Errorf("the replayed k1 was not counted as a duplicate")
	}
	res, err = c.Replay(ctx, dlq.ReplayOptions{Topic: e.dlq()})
	if err != nil {
		t.Fatal(err)
	}
	if res.Replayed != 0 {
		t.Fatalf("second replay replayed %d, want 0", res.Replayed)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := metricValue(t, e, "idem_dlq_depth", map[string]string{"topic": e.dlq()}); v != 0 {
			return fmt.Errorf("idem_dlq_depth = %v after the replay", v)
		}
		return nil
	})
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// A database outage (the inbox unusable: here its table is renamed away, so
// every transaction fails like an unreachable server would) makes the
// partition wait and retry the same message: nothing marked, nothing dropped,
// no attempt counted, Run keeps going; once the database is back every message
// has exactly one effect.
func TestStoreOutageRetriesSameMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	cfg := e.config()
	cfg.OutageBackoff = 100 * time.Millisecond
	ctx := testenv.Context(t)
	e.produce([]string{"before"}, 2)
	start(t, cfg, effectHandler())
	e.waitCommitted(e.topic, 2, 30*time.Second)

	if _, err := e.pool.Exec(ctx, `ALTER TABLE idem_processed RENAME TO idem_processed_away`); err != nil {
		t.Fatal(err)
	}
	keys, uniq := keysWithDuplicates(40, 0.2, 11)
	e.produce(keys, 2)
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := metricValue(t, e, "idem_store_errors_total", nil); v < 4 {
			return fmt.Errorf("store errors %v", v)
		}
		return nil
	})
	if got := e.committed(e.topic, 2); max(got[0], 0)+max(got[1], 0) != 1 {
		t.Fatalf("committed %v during the outage, want only the message before it", got)
	}
	if v := metricValue(t, e, "idem_handler_attempts_total", map[string]string{"result": "error"}); v != 0 {
		t.Fatalf("%v attempts counted as handler errors during a store outage", v)
	}
	if _, err := e.pool.Exec(ctx, `ALTER TABLE idem_processed_away RENAME TO idem_processed`); err != nil {
		t.Fatal(err)
	}
	e.waitCommitted(e.topic, 2, 60*time.Second)
	if n := e.count(`SELECT count(*) FROM effects`); n != uniq+1 {
		t.Fatalf("effects = %d, want %d", n, uniq+1)
	}
	if n := e.total(e.dlq(), 2); n != 0 {
		t.Fatalf("%d records dead-lettered by an outage", n)
	}
}

// handler.RetryAfter sets the least wait before the in-process retry.
func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.Retry.Attempts = 2
	var mu sync.Mutex
	var at []time.Time
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		mu.Lock()
		at = append(at, time.Now())
		n := len(at)
		mu.Unlock()
		if n == 1 {
			return handler.RetryAfter(errors.New("429 Too Many Requests"), 400*time.Millisecond)
		}
		return effectHandler()(ctx, m)
	})
	e.produce([]string{"k"}, 1)
	start(t, cfg, h)
	e.waitCommitted(e.topic, 1, 30*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 2 {
		t.Fatalf("%d attempts, want 2", len(at))
	}
	if gap := at[1].Sub(at[0]); gap < 400*time.Millisecond {
		t.Fatalf("retried after %s, sooner than RetryAfter's 400ms (Retry.Backoff.Max is %s)", gap, cfg.Retry.Backoff.Max)
	}
}

// TestDatabaseGoneUnderHandlerIsAnOutage: a handler whose connection is
// terminated (57P01) waits as in an outage — no retry budget spent, nothing
// dead-lettered — and the partition's stall shows in
// idem_partition_stalled_seconds until the message goes through.
func TestDatabaseGoneUnderHandlerIsAnOutage(t *testing.T) {
	e := newEnv(t, 1)
	var kills atomic.Int32
	release := make(chan struct{})
	kill := func() bool {
		if kills.Add(1) <= 3 {
			return true
		}
		<-release // stay stalled until the test has seen the gauge
		return false
	}
	e.produceHard([]hardRecord{{header: []byte("blip"), op: "kill"}, {header: []byte("after"), op: "ok"}})
	cfg := e.config()
	cfg.StallWarning = 200 * time.Millisecond
	cfg.OutageBackoff = 100 * time.Millisecond
	start(t, cfg, hardHandler(kill))

	labels := map[string]string{"topic": e.topic, "partition": "0"}
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := metricValue(t, e, "idem_partition_stalled_seconds", labels); v <= 0 {
			return fmt.Errorf("idem_partition_stalled_seconds = %v after %d kills", v, kills.Load())
		}
		return nil
	})
	close(release)
	e.waitCommitted(e.topic, 1, 30*time.Second)
	if n := e.count(`SELECT count(*) FROM effects WHERE key IN ('blip','after')`); n != 2 {
		t.Errorf("effects: %d, want 2", n)
	}
	if n := metricValue(t, e, "idem_retries_total", nil); n != 0 {
		t.Errorf("idem_retries_total = %v, want 0: an outage spends no retry budget", n)
	}
	if n := metricValue(t, e, "idem_store_errors_total", nil); n < 3 {
		t.Errorf("idem_store_errors_total = %v, want >= 3", n)
	}
	if n := metricValue(t, e, "idem_messages_total", map[string]string{"outcome": "dead_lettered"}); n != 0 {
		t.Errorf("dead-lettered %v, want 0", n)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if v := metricValue(t, e, "idem_partition_stalled_seconds", labels); v != 0 {
			return fmt.Errorf("idem_partition_stalled_seconds = %v after the message went through", v)
		}
		return nil
	})
}

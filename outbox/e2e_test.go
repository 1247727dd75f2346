package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/outbox"
)

// runConsumer runs consumer.Run on topic as group until the test ends, and
// relay (nil: none) next to it in this process, as a service runs it.
func (e *env) runConsumer(topic, group string, reg *prometheus.Registry, relay *outbox.Relay, h handler.Func, mutate ...func(*consumer.Config)) {
	e.t.Helper()
	if err := dedupe.NewPostgres(e.pool).Migrate(e.t.Context()); err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := consumer.Config{
		Brokers:        e.k.Brokers,
		Group:          group,
		Topics:         []string{topic},
		Dedupe:         dedupe.NewPostgres(e.pool),
		Sarama:         e.k.SaramaConfig(),
		Logger:         testLogger(e.t),
		Registerer:     reg,
		CommitInterval: 100 * time.Millisecond,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	relayDone := make(chan error, 1)
	if relay != nil {
		go func() { relayDone <- relay.Run(ctx) }()
	} else {
		relayDone <- nil
	}
	go func() { done <- consumer.Run(ctx, cfg, h) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("consumer.Run: %v", err)
		}
		if err := <-relayDone; err != nil {
			e.t.Errorf("relay.Run: %v", err)
		}
	})
}

// messages returns idem_messages_total{group,outcome,topic}.
func messages(t *testing.T, reg *prometheus.Registry, group, outcome, topic string) float64 {
	return metric(t, reg, "idem_messages_total", group, outcome, topic)
}

// TestRolledBackHandlerPublishesNothing (issue test 1): a handler enqueues
// an event in its transaction and fails; the transaction rolls back and the
// event never exists, so it is never published. The next message's event
// is. The relay runs next to the consumer, in its process and on its
// registry.
func TestRolledBackHandlerPublishesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	in := e.k.Topic(t, "in", 1) // deleted with its DLQ when the test ends
	group := e.k.Group(t, "g")
	out := e.consume(e.topic)
	reg := prometheus.NewRegistry()
	relay, _ := e.relay(e.pool)
	relay.Registerer = reg // the consumer's
	e.runConsumer(in, group, reg, relay, func(ctx context.Context, m *handler.Message) error {
		if err := outbox.Enqueue(ctx, dedupe.Tx(ctx), outbox.Message{Topic: e.topic, Key: m.Key, Value: m.Value}); err != nil {
			return err
		}
		if strings.HasPrefix(string(m.Value), "fail") {
			return handler.Permanent(errors.New("rejected after enqueueing its event"))
		}
		return nil
	})
	for _, v := range []string{"fail-1", "ok-1", "fail-2", "ok-2"} {
		e.k.Produce(t, in, idemtest.Record{IdempotencyKey: v, Key: []byte(v), Value: []byte(v)})
	}
	out.waitKeys(t, "ok-1", "ok-2")
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := messages(t, reg, group, "dead_lettered", in); n != 2 {
			return fmt.Errorf("%v dead-lettered, want 2", n)
		}
		if n := e.count("true"); n != 0 {
			return fmt.Errorf("%d rows in the outbox", n)
		}
		return nil
	})
	for _, m := range out.snapshot() {
		if strings.HasPrefix(string(m.Value), "fail") {
			t.Fatalf("the event of a rolled-back transaction was published: %s", m.Value)
		}
	}
	if n := len(out.snapshot()); n != 2 {
		t.Fatalf("%d events published, want 2", n)
	}
	if l := metric(t, reg, "idem_outbox_leader", "idem_outbox"); l != 1 {
		t.Fatalf("the in-process relay is not the leader on the consumer's registry: idem_outbox_leader = %v", l)
	}
}

const (
	childEnv    = "IDEM_OUTBOX_CRASH_CHILD" // the schema the child relays from
	ackedMarker = "IDEM-OUTBOX-CHILD-ACKED"
)

// TestRelayChildProcess is the relay the crash test runs in a child process
// (it does nothing in a normal run): it publishes, prints ackedMarker once
// Kafka acked its first round, and waits there, before deleting anything,
// for the SIGKILL.
func TestRelayChildProcess(t *testing.T) {
	e := childEnvOf(t, childEnv)
	if e == nil {
		return
	}
	r, _ := e.relay(e.pool)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	outbox.SetAfterAck(r, func(ids []int64) {
		if len(ids) > 0 {
			fmt.Printf("\n%s %v\n", ackedMarker, ids)
			<-ctx.Done() // the parent kills us here
		}
	})
	_ = r.Run(ctx)
	t.Fatal("the child was not killed within a minute")
}

// TestCrashAfterAckBeforeDelete (issue test 2): a relay process is killed
// (SIGKILL) after Kafka acked its event and before it deleted the row. The
// next relay publishes the event again with the same idem-outbox-id, and an
// idem consumer downstream applies it once.
func TestCrashAfterAckBeforeDelete(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.consume(e.topic)
	e.enqueue(e.msg("order-1", `{"event":"payment.recorded","order":"order-1"}`))

	c := e.startChild("TestRelayChildProcess", childEnv)
	if _, ok := c.WaitFor(func(line string) bool { return strings.HasPrefix(line, ackedMarker) }); !ok {
		t.Fatalf("the child relay exited without reporting an ack; stderr:\n%s", c.Stderr())
	}
	c.Kill(t)

	if n := e.count("state = 'pending'"); n != 1 {
		t.Fatalf("%d pending rows after the crash, want the acked row still there", n)
	}
	recs.waitKeys(t, "order-1")

	// The next relay (here, in this process) publishes it again.
	r, _ := e.relay(e.pool)
	start(t, r)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := len(recs.values("order-1")); n != 2 {
			return fmt.Errorf("%d copies on Kafka, want 2", n)
		}
		if n := e.count("true"); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
	all := recs.snapshot()
	id := header(all[0], outboxstore.HeaderID)
	for _, m := range all {
		if header(m, outboxstore.HeaderID) != id || header(m, outbox.HeaderIdempotencyKey) != id {
			t.Fatalf("copies differ: %v vs %v", all[0].Headers, m.Headers)
		}
	}

	// Downstream, an idem consumer applies the event once.
	if _, err := e.pool.Exec(t.Context(), "CREATE TABLE effects (event_id text NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	group := e.k.Group(t, "g")
	e.runConsumer(e.topic, group, reg, nil, func(ctx context.Context, m *handler.Message) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, "INSERT INTO effects VALUES ($1)", m.IdempotencyKey)
		return err
	})
	idemtest.Eventually(t, 60*time.Second, func() error {
		p, d := messages(t, reg, group, "processed", e.topic), messages(t, reg, group, "duplicate", e.topic)
		if p != 1 || d != 1 {
			return fmt.Errorf("processed %v, duplicate %v; want 1 and 1", p, d)
		}
		return nil
	})
	var n int
	if err := e.pool.QueryRow(t.Context(), "SELECT count(*) FROM effects WHERE event_id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the event was applied %d times downstream, want once", n)
	}
}

// TestStandbyTakesOver (issue test 3): two relays, one publishes; its
// database session is killed mid-stream; leadership moves to a new session
// (the standby's, or the old leader's reconnect) within seconds; every key's events arrive with no gap and in order (a re-sent
// copy of the last event before the kill is allowed).
func TestStandbyTakesOver(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	recs := e.consume(e.topic)
	a, regA := e.relay(e.pool)
	b, regB := e.relay(e.pool)
	start(t, a)
	waitMetric(t, regA, 1, "idem_outbox_leader", "idem_outbox")
	start(t, b)

	const n = 150
	keys := []string{"k0", "k1", "k2", "k3", "k4"}
	var wg sync.WaitGroup
	wg.Go(func() {
		for seq := 1; seq <= n && !t.Failed(); seq++ {
			var msgs []outbox.Message
			for _, k := range keys {
				msgs = append(msgs, e.msg(k, strconv.Itoa(seq)))
			}
			e.enqueue(msgs...)
		}
	})
	t.Cleanup(wg.Wait)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if got := len(recs.snapshot()); got < 100 {
			return fmt.Errorf("%d records published", got)
		}
		return nil
	})
	standingBy(t, regB)
	ctx := t.Context()
	var pid int32
	if err := e.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid::bigint = $1 AND objid = 'idem_outbox'::regclass::oid AND objsubid = 1`, 0x69646f78).Scan(&pid); err != nil {
		t.Fatalf("find the leader's session: %v", err)
	}
	killed := time.Now()
	if _, err := e.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	// Leadership goes to whichever relay takes the lock first: usually the
	// standby, but the killed leader's own reconnect (its backoff starts at
	// half of LeaderRetry) may win it back, which is just as correct. The test
	// asserts that some other session leads within seconds and that no
	// event is lost or reordered.
	idemtest.Eventually(t, 30*time.Second, func() error {
		var now int32
		if err := e.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid::bigint = $1 AND objid = 'idem_outbox'::regclass::oid AND objsubid = 1`, 0x69646f78).Scan(&now); err != nil {
			return fmt.Errorf("no leader yet: %v", err)
		}
		if now == pid {
			return fmt.Errorf("the killed session %d still holds the lock", pid)
		}
		if metric(t, regA, "idem_outbox_leader", "idem_outbox")+metric(t, regB, "idem_outbox_leader", "idem_outbox") != 1 {
			return fmt.Errorf("leader gauges do not sum to 1 yet")
		}
		return nil
	})
	takeover := time.Since(killed)
	t.Logf("takeover after the leader's session was killed: %s", takeover.Round(time.Millisecond))
	if takeover > 10*time.Second {
		t.Fatalf("takeover took %s, want seconds", takeover)
	}
	lead, other := regB, regA
	if metric(t, regA, "idem_outbox_leader", "idem_outbox") == 1 {
		lead, other = regA, regB
		t.Logf("the killed leader's reconnect won the lock back")
	}
	publishedAt := metric(t, lead, "idem_outbox_published_total", "idem_outbox")
	pendingAt := e.count("true")
	wg.Wait()
	idemtest.Eventually(t, 60*time.Second, func() error {
		for _, k := range keys {
			v := recs.values(k)
			if len(v) == 0 || v[len(v)-1] != strconv.Itoa(n) {
				return fmt.Errorf("key %s: %d records so far", k, len(v))
			}
		}
		return nil
	})
	for _, k := range keys {
		last := 0
		for _, s := range recs.values(k) {
			v, _ := strconv.Atoi(s)
			switch {
			case v == last+1:
				last = v
			case v <= last: // a copy re-sent after the kill
			default:
				t.Fatalf("key %s: %d after %d: a gap or a reorder (%v)", k, v, last, recs.values(k))
			}
		}
		if last != n {
			t.Fatalf("key %s ends at %d, want %d", k, last, n)
		}
	}
	if p := metric(t, lead, "idem_outbox_published_total", "idem_outbox"); pendingAt > 0 && p == publishedAt {
		t.Fatalf("the new leader published nothing after taking over (%d rows were pending)", pendingAt)
	}
	waitMetric(t, other, 0, "idem_outbox_leader", "idem_outbox")
}

// TestEnqueueInBatchMode: in batch mode dedupe.Tx(ctx) is the batch's
// transaction; every message's event commits with it and is published once.
func TestEnqueueInBatchMode(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	in := e.k.Topic(t, "in", 2)
	out := e.consume(e.topic)
	reg := prometheus.NewRegistry()
	relay, _ := e.relay(e.pool)
	group := e.k.Group(t, "g")
	e.runConsumer(in, group, reg, relay, func(ctx context.Context, m *handler.Message) error {
		return outbox.Enqueue(ctx, dedupe.Tx(ctx), outbox.Message{Topic: e.topic, Key: m.Key, Value: m.Value})
	}, func(c *consumer.Config) {
		c.Batch = consumer.BatchConfig{MaxMessages: 50, MaxWait: 50 * time.Millisecond}
	})
	var keys []string
	var recs []idemtest.Record
	for i := range 200 {
		k := "m" + strconv.Itoa(i)
		keys = append(keys, k)
		recs = append(recs, idemtest.Record{Partition: int32(i % 2), IdempotencyKey: k, Key: []byte(k), Value: []byte(k)})
	}
	e.k.Produce(t, in, recs...)
	out.waitKeys(t, keys...)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := e.count("true"); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
	if n := len(out.snapshot()); n != len(keys) {
		t.Fatalf("%d events for %d messages", n, len(keys))
	}
}

// TestSeriesExistOnAStandby: a relay that has published nothing, here a
// standby behind a leader, exports idem_outbox_published_total and
// idem_outbox_publish_seconds at zero, so a dashboard panel over them is not
// empty for it (TestObservability of the payments example failed when its
// relay was a standby behind another test's relay on the same table).
func TestSeriesExistOnAStandby(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	a, regA := e.relay(e.pool)
	b, regB := e.relay(e.pool)
	start(t, a)
	waitMetric(t, regA, 1, "idem_outbox_leader", "idem_outbox")
	start(t, b)
	idemtest.Eventually(t, 30*time.Second, func() error {
		var missing []string
		for _, name := range []string{"idem_outbox_published_total", "idem_outbox_publish_seconds", "idem_outbox_leader"} {
			if _, found := testenv.MetricFound(t, regB, name, map[string]string{"table": "idem_outbox"}); !found {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("the standby exports no series of %v", missing)
		}
		return nil
	})
	if l := metric(t, regB, "idem_outbox_leader", "idem_outbox"); l != 0 {
		t.Fatalf("relay B leads (%v) while A does", l)
	}
}

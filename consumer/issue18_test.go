package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// Issue 18 #12 and issue 19: a record forwarded to a tier and then to the
// DLQ keeps its own idem-… headers that are not the wire contract's (here
// outbox.Relay's idem-outbox-id), the handler sees it in the tier, and both
// forwarded records name the idempotency key idem derived (here from a JSON
// field) in idem-idempotency-key.
func TestForwardKeepsOwnHeadersAndNamesTheKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.KeyFunc = consumer.JSONField("id")
	cfg.Retries = -1
	cfg.Retry = retrytopic.Policy{Delays: []time.Duration{100 * time.Millisecond}}
	seen := make(chan string, 4)
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		v, _ := m.Header("idem-outbox-id")
		seen <- string(v)
		if m.Attempt == 1 {
			return errors.New("first try fails")
		}
		return handler.Permanent(errors.New("then for good"))
	})
	p := e.k.Producer(t)
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder(`{"id":"order-7"}`),
		Headers: []sarama.RecordHeader{{Key: []byte("idem-outbox-id"), Value: []byte("42")}}}); err != nil {
		t.Fatal(err)
	}
	start(t, cfg, h)
	for i := range 2 {
		select {
		case v := <-seen:
			if v != "42" {
				t.Fatalf("delivery %d: handler saw idem-outbox-id %q, want 42", i+1, v)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("delivery %d never came", i+1)
		}
	}
	m := e.onlyDLQRecord(30 * time.Second)
	tier := e.readAll(e.tier(1), 1)
	for _, r := range append(tier, m) {
		if got := header(r, "idem-outbox-id"); got != "42" {
			t.Errorf("%s: idem-outbox-id = %q, want 42", r.Topic, got)
		}
		if got := header(r, retrytopic.HeaderIdempotencyKey); got != "order-7" {
			t.Errorf("%s: %s = %q, want order-7", r.Topic, retrytopic.HeaderIdempotencyKey, got)
		}
	}
}

// parkBig parks ik (value value) behind key's head, as a consumer would.
func (e *env) parkBig(key []byte, ik string, offset int64, value []byte) {
	e.t.Helper()
	st, err := keyorder.New(e.pool, e.group).Park(testenv.Context(e.t), keyorder.Record{Topic: e.topic, Key: key, IdempotencyKey: ik,
		Offset: offset, Timestamp: time.Now(), Value: value, Headers: []keyorder.Header{{Key: "idempotency-key", Value: []byte(ik)}}})
	if err != nil || st != keyorder.Blocked {
		e.t.Fatalf("park %s: %v, %v", ik, st, err)
	}
}

// blockedBehindBigM makes H the head of key K (in tier 1), parks M (5,000
// bytes, more than tier 1 takes) and P behind it, and returns K.
func (e *env) blockedBehindBigM() []byte {
	e.t.Helper()
	e.smallTier()
	key := []byte("K")
	e.block(key, "H", 1)
	e.parkBig(key, "M", 1000, big(5000))
	e.parkBig(key, "P", 1001, []byte("P"))
	return key
}

// smallTier creates e's retry tier 1 (before Run does) refusing records over
// 1,000 bytes: a tier that refuses some records for good.
func (e *env) smallTier() {
	e.t.Helper()
	e.preCreate(e.tier(1), map[string]string{"max.message.bytes": "1000"})
}

// Issue 18 #1: a drain promotes parked M to head, but tier 1 refuses M for
// good (too large), so M goes to the DLQ. M will never come back from the
// tier: the drain must go on with the messages parked behind M (P), not
// leave the key blocked by a head that is in the DLQ.
func TestOrderingDrainDeadLetteredPromotion(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
	key := e.blockedBehindBigM()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "M" {
			return errors.New("M fails")
		}
		return apply(ctx, m)
	})
	e.send(e.k.Producer(t), 0, key, "H")
	start(t, cfg, h)
	e.waitSettled("H,P")
	m := e.onlyDLQRecord(30 * time.Second)
	if got := header(m, retrytopic.HeaderIdempotencyKey); got != "M" {
		t.Fatalf("DLQ record is %q, want M", got)
	}
}

// Issue 18 #2: a crash left M, a promoted head, with its forward to tier 1
// pending; tier 1 refuses M for good. Recovery must end in a defined
// outcome: M dead-lettered whole (never forwarded to a topic named ""), the
// messages parked behind it drained, and Run running (not failing at start,
// not looping).
func TestOrderingPendingHeadRefusedByItsTier(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
	key := e.blockedBehindBigM()
	ctx := testenv.Context(t)
	s := keyorder.New(e.pool, e.group)
	next, ok, err := s.Next(ctx, e.topic, key, "H")
	if err != nil || !ok || next.IdempotencyKey != "M" {
		t.Fatalf("Next = %v, %v, %v", next.IdempotencyKey, ok, err)
	}
	now := time.Now()
	next.Tier = 1
	next.Headers = nil
	for _, h := range retrytopic.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("M")}}, retrytopic.Failure{
		Attempt: 1, Tier: 1, DueAt: now, OriginalTopic: e.topic, OriginalOffset: 1000, OriginalTimestamp: now, Group: e.group,
		Error: "M fails", Kind: handler.KindRetriable, FirstFailureAt: now, LastFailureAt: now, IdempotencyKey: "M",
	}) {
		next.Headers = append(next.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
	}
	if err := s.Promote(ctx, "H", next); err != nil {
		t.Fatal(err)
	}
	r := start(t, cfg, handler.Func(apply))
	testenv.Eventually(t, 60*time.Second, func() error {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("Run returned %v", err)
		default:
		}
		if got := e.applied(); got != "P" {
			return fmt.Errorf("applied %q, want P", got)
		}
		if n := e.orderingRows(); n != 0 {
			return fmt.Errorf("%d ordering rows left", n)
		}
		return nil
	})
	// The claims of the source partition and of its tier partition may both
	// recover M: two copies in the DLQ are possible, as after a crash.
	dl := e.readAll(e.dlq(), 1)
	if len(dl) == 0 {
		t.Fatal("M not in the DLQ")
	}
	for _, m := range dl {
		if got := header(m, retrytopic.HeaderIdempotencyKey); got != "M" || len(m.Value) != 5000 {
			t.Fatalf("DLQ record %q with %d bytes, want M whole", got, len(m.Value))
		}
	}
}

// recoveryDown is an ordering database on which the start-of-claim
// recovery's query (the pending heads) fails as if PostgreSQL were
// unreachable; every other statement works.
type recoveryDown struct{ dedupe.DB }

func (d recoveryDown) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.DB.Begin(ctx)
	return recoveryDownTx{tx}, err
}

type recoveryDownTx struct{ pgx.Tx }

func (t recoveryDownTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if strings.Contains(sql, "pending IS NOT NULL") {
		return nil, errors.New("recoveryDown: connection refused")
	}
	return t.Tx.Query(ctx, sql, args...)
}

// Issue 18 #7: a member whose claims are stuck in the ordering store's
// start-of-claim recovery (the store is down) must still give a partition
// up at once when a cooperative rebalance revokes it. Otherwise it overruns
// Rebalance.Timeout and sarama ends its whole session (ErrRebalanceTimedOut):
// the claims it keeps end too, not only the revoked ones.
func TestOrderingClaimRecoveryWatchesRevoke(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 2, 200*time.Millisecond)
	sc := e.k.Config()
	sc.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	cfg.Sarama = sc
	cfg.ShutdownGrace = time.Second
	var assignedA, revokedA, assignedB atomic.Int32
	a := cfg
	a.OrderingDB = recoveryDown{e.pool}
	a.OnAssigned = func(_ context.Context, ps []consumer.TopicPartition) { assignedA.Add(int32(len(ps))) }
	a.OnRevoked = func(_ context.Context, ps []consumer.TopicPartition) { revokedA.Add(int32(len(ps))) }
	start(t, a, handler.Func(apply))
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := assignedA.Load(); n != 4 { // 2 source + 2 tier partitions, each stuck in recovery
			return fmt.Errorf("A assigned %d partitions", n)
		}
		return nil
	})
	b := cfg // B joins: A must give up half of its partitions, and only those
	b.Registerer = prometheus.NewRegistry()
	b.OnAssigned = func(_ context.Context, ps []consumer.TopicPartition) { assignedB.Add(int32(len(ps))) }
	start(t, b, handler.Func(apply))
	testenv.Eventually(t, 60*time.Second, func() error {
		if assignedB.Load() == 0 {
			return errors.New("B not assigned yet")
		}
		return nil
	})
	if n := revokedA.Load(); n != 2 {
		t.Fatalf("A's claims ended: %d, want the 2 revoked: A overran Rebalance.Timeout and lost its whole session", n)
	}
}

// Issue 18 #11: a head that has waited in its tier longer than the tier
// topic keeps records: its tier record expired, it will never come back, and
// Run warns at start about the messages parked behind it.
func TestOrderingWarnsAboutExpiredHeads(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 1, time.Second)
	cfg.Retry.Retention = time.Hour
	e.block([]byte("K"), "H", 1, "P1", "P2")
	if _, err := e.pool.Exec(testenv.Context(t), `UPDATE idem_ordering_heads SET since = now() - interval '3 hours'`); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start(t, cfg, handler.Func(apply))
	testenv.Eventually(t, 30*time.Second, func() error {
		out := logs.String()
		for _, want := range []string{"will not read", "topic=" + e.topic, "keys=1", "parked=2", "expired",
			"idem ordering release --group " + e.group + " --topic " + e.topic + " --all"} {
			if !strings.Contains(out, want) {
				return fmt.Errorf("log lacks %q:\n%s", want, out)
			}
		}
		return nil
	})
}

// sendAll produces one record per idempotency key to partition 0, all with
// Kafka key key, in one request (so they arrive in one fetch, one batch).
func (e *env) sendAll(key string, ikeys ...string) {
	e.t.Helper()
	msgs := make([]*sarama.ProducerMessage, len(ikeys))
	for i, ik := range ikeys {
		msgs[i] = &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(ik),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(ik)}}}
	}
	if err := e.k.Producer(e.t).SendMessages(msgs); err != nil {
		e.t.Fatal(err)
	}
}

// batchEnv is an env with the applied table and a config that takes what
// one request produced in one batch, in one lane.
func batchEnv(t *testing.T) (*env, consumer.Config) {
	t.Helper()
	e := newEnv(t, 1)
	if _, err := e.pool.Exec(testenv.Context(t), `CREATE TABLE applied(seq bigserial primary key, ikey text)`); err != nil {
		t.Fatal(err)
	}
	cfg := e.config()
	cfg.Batch = consumer.BatchConfig{MaxMessages: 50, MaxWait: time.Second}
	cfg.Concurrency = 1
	return e, cfg
}

// Issue 18 #10: RunBatch's handler names A1 in a *BatchError. A1 and A2
// share their lane key, and LaneBy promises their order: A2 must not be
// committed before A1's retry. A failed batch runs each message alone, in
// order.
func TestRunBatchErrorKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	e, cfg := batchEnv(t)
	var c calls
	h := handler.BatchFunc(func(ctx context.Context, msgs []*handler.Message) error {
		for _, m := range msgs {
			if m.IdempotencyKey == "A1" && c.inc("A1") == 1 {
				return (&handler.BatchError{}).Add(m, errors.New("A1 fails once"))
			}
		}
		for _, m := range msgs {
			if err := apply(ctx, m); err != nil {
				return err
			}
		}
		return nil
	})
	e.sendAll("A", "A1", "A2", "A3")
	startBatch(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := e.applied(); got != "A1,A2,A3" {
			return fmt.Errorf("applied %q, want A1,A2,A3", got)
		}
		return nil
	})
}

// Issue 18 #13: in a batch, X's handler swallows an SQL error, which aborts
// the shared transaction; Y's next statement then fails with 25P02. That
// failure is X's doing: Y must not be charged with it (here, with no retry
// budget and no tiers, Y would be dead-lettered). Y is applied; X, run alone,
// fails on its own and is dead-lettered.
func TestBatchAbortedTransactionBlamesNoInnocent(t *testing.T) {
	t.Parallel()
	e, cfg := batchEnv(t)
	cfg.Retries = -1
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "X" {
			_, _ = dedupe.Tx(ctx).Exec(ctx, `SELECT 1/0`) // swallowed: the transaction is aborted
			return nil
		}
		return apply(ctx, m)
	})
	e.sendAll("K", "X", "Y")
	start(t, cfg, h)
	m := e.onlyDLQRecord(60 * time.Second)
	if got := header(m, retrytopic.HeaderIdempotencyKey); got != "X" {
		t.Fatalf("dead-lettered %q, want X (Y is innocent)", got)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := e.applied(); got != "Y" {
			return fmt.Errorf("applied %q, want Y", got)
		}
		return nil
	})
}

// Issue 18 #14: a dedupe store whose configuration is wrong (here an empty
// inbox table name) fails every unit of work the same way for ever: Run
// returns that error instead of retrying it as an outage.
func TestStoreConfigErrorStopsRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.Dedupe = dedupe.NewPostgres(e.pool, dedupe.WithTable(""))
	e.sendAll("K", "A")
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { done <- consumer.Run(ctx, cfg, handler.Func(apply)) }()
	select {
	case err := <-done:
		var se *dedupe.StoreError
		if !errors.As(err, &se) || se.Op != "config" {
			t.Fatalf("Run returned %v, want the store's config error", err)
		}
	case <-time.After(60 * time.Second):
		cancel()
		<-done
		t.Fatal("Run kept retrying a store configuration error as an outage")
	}
}

// Issue 18 #14: a keyless record whose own headers alone are larger than
// the dead-letter topic takes (so even a stub without its value is refused)
// is dead-lettered as a bare stub: idem's headers only, idem-headers-omitted
// saying how many of its own were left out. The partition moves on.
func TestHeadersTooLargeForTheDLQEndInABareStub(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.preCreate(e.dlq(), map[string]string{"max.message.bytes": "4000"})
	cfg := e.config()
	m := &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder("v"),
		Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("huge")}}}
	for i := range 10 {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: fmt.Appendf(nil, "h%d", i), Value: big(1000)})
	}
	p := e.bigProducer()
	if _, _, err := p.SendMessage(m); err != nil {
		t.Fatal(err)
	}
	e.produceLarge(sizeRecord{key: "after", value: []byte(`{}`)})
	start(t, cfg, failKeys(map[string]error{"huge": handler.Permanent(errors.New("cannot apply"))}))
	e.waitEffect("after", 60*time.Second)
	d := e.onlyDLQRecord(30 * time.Second)
	if got := header(d, retrytopic.HeaderHeadersOmitted); got != "11" {
		t.Fatalf("%s = %q, want 11 (its own headers)", retrytopic.HeaderHeadersOmitted, got)
	}
	if got := header(d, retrytopic.HeaderIdempotencyKey); got != "huge" || header(d, "h0") != "" {
		t.Fatalf("bare stub: key %q, h0 %d bytes", got, len(header(d, "h0")))
	}
}

// Issue 18 #14: idem_consumer_lag has a series for a claimed partition from
// the start, not only after the first LagInterval.
func TestLagSampledAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.LagInterval = time.Hour
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return ctx.Err()
	})
	e.produce([]string{"a", "b", "c"}, 1)
	start(t, cfg, h)
	labels := map[string]string{"group": e.group, "topic": e.topic}
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metricValue(t, e, "idem_consumer_lag", labels); got != 3 {
			return fmt.Errorf("lag %v, want 3 (nothing committed) well before LagInterval", got)
		}
		return nil
	})
}

// Issue 18 #15: a handler panic is logged at ERROR with its stack, the
// dead-letter at WARN, and Run says when it starts (group, topics, mode,
// tiers) and stops.
func TestPanicAndLifecycleLogs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	var logs logBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "boom" {
			panic("kaboom")
		}
		return effectHandler()(ctx, m)
	})
	e.produce([]string{"boom", "fine"}, 1)
	r := start(t, cfg, h)
	e.waitEffect("fine", 60*time.Second)
	e.onlyDLQRecord(30 * time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	for _, want := range [][]string{
		{"level=ERROR", "handler panicked", "panic=kaboom", "stack=", "goroutine"},
		{"level=WARN", "dead-lettered", "kind=panic"},
		{"level=INFO", "consumer started", "group=" + e.group, e.topic, "mode=per-message", "tiers="},
		{"level=INFO", "consumer stopped", "group=" + e.group},
	} {
		if !logLine(out, want...) {
			t.Errorf("no log line with %q:\n%s", want, out)
		}
	}
}

// logLine reports whether one line of out contains every part.
func logLine(out string, parts ...string) bool {
next:
	for _, l := range strings.Split(out, "\n") {
		for _, p := range parts {
			if !strings.Contains(l, p) {
				continue next
			}
		}
		return true
	}
	return false
}

// Issue 18 #15: under JSONField a record whose value is not JSON is
// dead-lettered with kind decode, not missing-key.
func TestJSONFieldNonJSONIsDecode(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.KeyFunc = consumer.JSONField("id")
	e.produceLarge(sizeRecord{key: "x", value: []byte("not json")}, sizeRecord{key: "y", value: []byte(`{"id":"y"}`)})
	start(t, cfg, effectHandler())
	e.waitEffect("y", 60*time.Second)
	m := e.onlyDLQRecord(30 * time.Second)
	if got := header(m, retrytopic.HeaderErrorKind); got != string(handler.KindDecode) {
		t.Fatalf("%s = %q, want decode", retrytopic.HeaderErrorKind, got)
	}
}

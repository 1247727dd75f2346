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
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

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
// leave the key blocked by a head that is in the DLQ. With Transactions the
// refusal aborts the drain's transaction: the drain is reverted and runs
// again, and M reaches the DLQ once for a read_committed reader.
func TestOrderingDrainDeadLetteredPromotion(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"", "txn"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
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
		dl := e.records(e.dlq(), sarama.ReadCommitted)
		if len(dl) != 1 || header(dl[0], wire.HeaderIdempotencyKey) != "M" {
			t.Fatalf("DLQ holds %d records for a read_committed reader, want M once", len(dl))
		}
	})
}

// Issue 18 #2: a crash left M, a promoted head, with its forward to tier 1
// pending; tier 1 refuses M for good. Recovery must end in a defined
// outcome: M dead-lettered whole (never forwarded to a topic named ""), the
// messages parked behind it drained, and Run running (not failing at start,
// not looping).
func TestOrderingPendingHeadRefusedByItsTier(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"", "txn"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		orderingPendingHeadRefusedByItsTier(t, e, cfg)
	})
}

func orderingPendingHeadRefusedByItsTier(t *testing.T, e *env, cfg consumer.Config) {
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
	for _, h := range wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("M")}}, retrytopic.Failure{
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
	// Only the source partition's claim recovers M (issue 28): one copy.
	dl := e.records(e.dlq(), sarama.ReadCommitted) // not by end offsets: with Transactions they count commit markers
	if len(dl) != 1 {
		t.Fatalf("%d copies of M in the DLQ, want 1", len(dl))
	}
	for _, m := range dl {
		if got := header(m, wire.HeaderIdempotencyKey); got != "M" || len(m.Value) != 5000 {
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
	sc := e.k.SaramaConfig()
	sc.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	cfg.Sarama = sc
	cfg.ShutdownGrace = time.Second
	var assignedA, revokedA, assignedB atomic.Int32
	a := cfg
	a.Ordering = consumer.ByKey(recoveryDown{e.pool})
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
	cfg.Retry.Tiers.Retention = time.Hour
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

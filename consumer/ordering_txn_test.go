package consumer_test

// Ordering ByKey with Transactions (issue 20): a drain's forwards commit in
// the transaction of its head's offset; an abort or a SIGKILL before that
// commit reverts the drain's steps, and the head's redelivery runs it again.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
)

// ikeyCopies reads topic from the start with a read_committed reader (see
// records) and returns how many records each idempotency key has.
func (e *env) ikeyCopies(topic string) map[string]int {
	e.t.Helper()
	out := map[string]int{}
	for _, m := range e.records(topic, sarama.ReadCommitted) {
		out[header(m, wire.HeaderIdempotencyKey)]++
	}
	return out
}

// A transaction that aborts while it holds a drain's forwards: H's drain
// dead-letters P1 and promotes P2 to tier 1, and that transaction is aborted
// (BeforeCommit fails it). The drain's steps are reverted, H is read again
// and drains again: P1 reaches the DLQ once, P2 tier 1 once, P3 follows P2,
// and no ordering row is left.
func TestOrderingTxnAbortedDrain(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		var aborted atomic.Int32
		ctx := consumer.WithBeforeCommitHook(testenv.Context(t), func(records int) error {
			// H's own forward holds one record; the drain's hold two (P1, P2).
			if records >= 2 && aborted.CompareAndSwap(0, 1) {
				return fmt.Errorf("forced abort of the drain's transaction (%d records)", records)
			}
			return nil
		})
		var mu sync.Mutex
		calls := map[string]int{}
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			mu.Lock()
			calls[m.IdempotencyKey]++
			n := calls[m.IdempotencyKey]
			mu.Unlock()
			switch {
			case m.IdempotencyKey == "H" && n == 1:
				return errors.New("H fails once")
			case m.IdempotencyKey == "P1":
				return handler.Permanent(errors.New("P1 is poison"))
			case m.IdempotencyKey == "P2" && n <= 2: // in the aborted drain and in the one after
				return errors.New("P2 fails twice")
			}
			return apply(ctx, m)
		})
		p := e.k.Producer(t)
		for _, ik := range []string{"H", "P1", "P2", "P3"} {
			e.send(p, 0, []byte("K"), ik)
		}
		r := startCtx(t, ctx, cfg, h)
		testenv.Eventually(t, 60*time.Second, func() error {
			if got := e.applied(); got != "H,P2,P3" {
				return fmt.Errorf("applied %q, want H,P2,P3", got)
			}
			if n := e.orderingRows(); n != 0 {
				return fmt.Errorf("%d ordering rows left", n)
			}
			return nil
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if aborted.Load() != 1 {
			t.Fatal("no transaction with the drain's forwards was aborted")
		}
		if got := e.ikeyCopies(e.dlq()); len(got) != 1 || got["P1"] != 1 {
			t.Errorf("DLQ for a read_committed reader: %v, want P1 once", got)
		}
		if got := e.ikeyCopies(e.tier(1)); len(got) != 2 || got["H"] != 1 || got["P2"] != 1 {
			t.Errorf("tier 1 for a read_committed reader: %v, want H and P2 once each", got)
		}
		// The aborted copies are in the log: the abort hit the drain.
		if n := len(e.records(e.dlq(), sarama.ReadUncommitted)); n < 2 {
			t.Errorf("read_uncommitted readers see %d DLQ records, want the aborted copy of P1 too", n)
		}
	})
}

// Environment of the transactional member helper for ordering.
const txnEnvOrdering = "IDEM_TXN_ORDERING" // set: Ordering ByKey, orderedTxnHandler

// orderedTxnKeys is how many records produceOrderedTxnKeys sends, over
// orderedTxnKafkaKeys Kafka keys.
const (
	orderedTxnKeys      = 90
	orderedTxnKafkaKeys = 6
)

// orderedTxnIkey is record i's idempotency key: "poison-" (always fails,
// retriable: tier 1, then the DLQ), "perm-" (fails for good: the DLQ) or
// "good-".
func orderedTxnIkey(i int) string {
	switch {
	case i%7 == 3:
		return fmt.Sprintf("poison-%d", i)
	case i%11 == 5:
		return fmt.Sprintf("perm-%d", i)
	}
	return fmt.Sprintf("good-%d", i)
}

// produceOrderedTxnKeys sends record i with Kafka key K<i%6> to partition
// (i%6)%3, so each Kafka key stays on one partition.
func (e *env) produceOrderedTxnKeys() {
	e.t.Helper()
	p := e.k.Producer(e.t)
	for i := range orderedTxnKeys {
		k := i % orderedTxnKafkaKeys
		e.send(p, int32(k%txnPartitions), fmt.Appendf(nil, "K%d", k), orderedTxnIkey(i))
	}
}

// orderedTxnHandler fails "poison-" keys (retriable) and "perm-" keys (for
// good) and writes the effect of the others.
func orderedTxnHandler() handler.Func {
	eff := effectHandler()
	return func(ctx context.Context, m *handler.Message) error {
		switch {
		case strings.HasPrefix(m.IdempotencyKey, "poison-"):
			return errors.New("poison")
		case strings.HasPrefix(m.IdempotencyKey, "perm-"):
			return handler.Permanent(errors.New("perm"))
		}
		return eff(ctx, m)
	}
}

// markedRowsQuery counts the ordering rows a drain marked and no commit or
// claim settled yet.
func markedRowsQuery() string {
	return `SELECT (SELECT count(*) FROM idem_ordering_parked WHERE mark_topic IS NOT NULL) +
		(SELECT count(*) FROM idem_ordering_heads WHERE mark_topic IS NOT NULL)`
}

// A member is SIGKILLed in the middle of a drain: at the commit of a
// transaction holding a drain's forwards, with the drain's steps marked in
// PostgreSQL. Its successor reverts them and drains again: each parked
// message reaches its tier or the DLQ exactly once for a read_committed
// reader, every good record is applied once, in its key's order, and no key
// is left blocked.
func TestOrderingTxnKillMidDrain(t *testing.T) {
	t.Parallel()
	for _, lanes := range []string{"", "8"} {
		t.Run("lanes="+lanes, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, txnPartitions)
			e.produceOrderedTxnKeys()
			child := e.startTxnChild("kill-drain", "txn-member", 10*time.Second, txnEnvLanes+"="+lanes, txnEnvOrdering+"=1")
			if err := child.WaitWithin(t, 120*time.Second); !testenv.Killed(err) {
				t.Fatalf("txn member helper ended with %v, want killed in a drain's commit; its log:\n%s", err, child.Output())
			}
			if n := e.count(markedRowsQuery()); n == 0 {
				t.Fatal("killed with no drain step marked: the crash missed the drain")
			}
			cfg := txnLanes(txnConfig(e.config(), "txn-member"), lanes)
			cfg.Ordering = consumer.ByKey(e.pool)
			cfg.Registerer = prometheus.NewRegistry()
			r := start(t, cfg, orderedTxnHandler())
			var good, dead []string
			for i := range orderedTxnKeys {
				if ik := orderedTxnIkey(i); strings.HasPrefix(ik, "good-") {
					good = append(good, ik)
				} else {
					dead = append(dead, ik)
				}
			}
			testenv.Eventually(t, 120*time.Second, func() error {
				if n := e.count(`SELECT count(*) FROM effects`); n < len(good) {
					return fmt.Errorf("%d effects of %d", n, len(good))
				}
				if n := e.orderingRows(); n != 0 {
					return fmt.Errorf("%d ordering rows left", n)
				}
				if n := len(e.ikeyCopies(e.dlq())); n < len(dead) {
					return fmt.Errorf("%d keys dead-lettered of %d", n, len(dead))
				}
				return nil
			})
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			dlq, tier := e.ikeyCopies(e.dlq()), e.ikeyCopies(e.tier(1))
			for _, ik := range dead {
				wantTier := 0
				if strings.HasPrefix(ik, "poison-") {
					wantTier = 1
				}
				if dlq[ik] != 1 || tier[ik] != wantTier {
					t.Errorf("%s: %d DLQ copies, %d tier-1 copies for a read_committed reader; want 1 and %d", ik, dlq[ik], tier[ik], wantTier)
				}
			}
			if len(dlq) != len(dead) {
				t.Errorf("DLQ holds %d keys, want %d", len(dlq), len(dead))
			}
			if n, d := e.count(`SELECT count(*) FROM effects`), e.count(`SELECT count(DISTINCT key) FROM effects`); n != len(good) || d != len(good) {
				t.Errorf("%d effects of %d keys, want %d once each", n, d, len(good))
			}
			// Key order: each Kafka key's good records were applied in their
			// source offset order (a drained record keeps its source offset).
			var inversions int
			if err := e.query.QueryRow(testenv.Context(t), `SELECT count(*) FROM (
				SELECT off, lag(off) OVER (PARTITION BY part, split_part(key, '-', 2)::int % $1 ORDER BY at, off) AS prev FROM effects) x
				WHERE prev > off`, orderedTxnKafkaKeys).Scan(&inversions); err != nil {
				t.Fatal(err)
			}
			if inversions != 0 {
				t.Errorf("%d effects applied before an earlier record of their key", inversions)
			}
		})
	}
}

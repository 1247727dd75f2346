package consumer_test

// Crossing tests of issue 28, second phase: defects the swarm found that the
// issue did not list. A message's outcome is decided once: a redelivery of a
// message whose outcome is already durable (applied, deferred) keeps that
// outcome, whatever the clock says now.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/schedule"
)

// expiredHooks counts Expiry.OnExpired calls by idempotency key.
func expiredHooks(c *calls) func(ctx context.Context, x consumer.Expired) error {
	return func(ctx context.Context, x consumer.Expired) error {
		c.inc(x.Message.IdempotencyKey)
		return nil
	}
}

// abortOnceAfter is a BeforeCommit hook that, the first time ready says so,
// waits until at (so the records of the transaction are read again after
// it) and aborts the transaction; aborted reports whether it did.
func abortOnceAfter(t *testing.T, ready func() bool, at time.Time, aborted *atomic.Bool) func(int) error {
	return func(int) error {
		if aborted.Load() || !ready() {
			return nil
		}
		aborted.Store(true)
		select {
		case <-time.After(time.Until(at)):
		case <-t.Context().Done():
		}
		return errors.New("forced abort of the transaction carrying the message's offset")
	}
}

// checkAppliedNotExpired stops r and checks that a transaction was aborted,
// and that M, applied before its deadline, is neither in the DLQ for a
// read_committed reader nor passed to OnExpired (hooks).
func (e *env) checkAppliedNotExpired(r *running, aborted *atomic.Bool, hooks *calls) {
	e.t.Helper()
	if err := r.stop(); err != nil {
		e.t.Fatal(err)
	}
	if !aborted.Load() {
		e.t.Fatal("no transaction was aborted")
	}
	if got := e.ikeyCopies(e.dlq()); len(got) != 0 {
		e.t.Errorf("DLQ for a read_committed reader: %v, want nothing (M was applied before its deadline)", got)
	}
	if n := hooks.get("M"); n != 0 {
		e.t.Errorf("OnExpired ran %d times for M, which was applied", n)
	}
}

// Swarm (issue 28, phase 2, "expiry before the inbox"): M is applied, and
// the transaction carrying its offset aborts; M is read again after its
// deadline. Its outcome is decided: applied. The redelivery is a duplicate,
// not an expired message: no DLQ record, no OnExpired call. (The consumer
// checked expiry before the inbox: M was dead-lettered as expired and its
// hook ran, though applied; the swarm's most frequent failure.)
func TestCrossingAppliedThenExpiredIsDuplicate(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes", "txn-batch"}, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1)
		cfg := txnConfig(e.config(), "")
		switch mode {
		case "txn-lanes":
			cfg.Concurrency = 4
		case "txn-batch":
			cfg.Batch = consumer.BatchConfig{MaxMessages: 8}
		}
		var hooks calls
		cfg.Expiry.OnExpired = expiredHooks(&hooks)
		deadline := time.Now().Add(3 * time.Second)
		var aborted atomic.Bool
		ctx := consumer.WithBeforeCommitHook(testenv.Context(t), abortOnceAfter(t, func() bool {
			return e.count(`SELECT count(*) FROM effects WHERE key = 'M'`) > 0
		}, deadline.Add(500*time.Millisecond), &aborted))
		e.produceExpiry(expiryRec{ikey: "A"}, expiryRec{ikey: "M", deadline: strconv.FormatInt(deadline.UnixMilli(), 10)}, expiryRec{ikey: "B"})
		r := startCtx(t, ctx, cfg, effectHandler())
		e.waitCommitted(e.topic, 1, 60*time.Second)
		e.checkAppliedNotExpired(r, &aborted, &hooks)
		if n := e.count(`SELECT count(*) FROM effects WHERE key = 'M'`); n != 1 {
			t.Errorf("M applied %d times, want 1", n)
		}
	})
}

// The drain's side of the same defect: M is applied, H after it (same
// Kafka key) fails into its tier, and the transaction carrying M's offset
// aborts. M is read again while H is the key's head, and parked behind it;
// H comes back after M's deadline and its drain reaches M. M is a
// duplicate then, not expired.
func TestCrossingParkedAppliedCopyIsDuplicate(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 4*time.Second)
		e.in(mode)
		cfg = mode.apply(cfg)
		var hooks calls
		cfg.Expiry.OnExpired = expiredHooks(&hooks)
		deadline := time.Now().Add(3 * time.Second)
		var aborted atomic.Bool
		ctx := consumer.WithBeforeCommitHook(testenv.Context(t), abortOnceAfter(t, func() bool {
			return e.count(`SELECT count(*) FROM applied WHERE ikey = 'M'`) > 0 && e.count(`SELECT count(*) FROM idem_ordering_heads`) > 0
		}, time.Now(), &aborted))
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "H" && m.Topic == e.topic {
				return errors.New("H fails at its source")
			}
			return apply(ctx, m)
		})
		e.produceExpiry(expiryRec{ikey: "M", kafkaKey: "K", deadline: strconv.FormatInt(deadline.UnixMilli(), 10)}, expiryRec{ikey: "H", kafkaKey: "K"})
		r := startCtx(t, ctx, cfg, h)
		e.waitSettled("M,H")
		e.waitCommitted(e.topic, 1, 60*time.Second)
		e.checkAppliedNotExpired(r, &aborted, &hooks)
	})
}

// Swarm (issue 28, phase 2, "an expired deferred copy"): the handler defers
// M; the deferral is stored, and the transaction carrying M's offset
// aborts. M's deadline passes before M is read again and before its
// deferred copy comes back. M's outcome was decided (deferred): the source's
// redelivery keeps it, so M reaches the DLQ once, from its deferred copy,
// naming M's source as its origin, and OnExpired runs once. (The source's
// redelivery was dead-lettered too: two DLQ records of one message for a
// read_committed reader.)
func TestCrossingDeferredThenExpiredDeadLetteredOnce(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(3 * time.Second)
	e, run := deferThenExpire(t, deadline, deadline.Add(500*time.Millisecond), nil)
	dlq := run.dlq
	var got []string
	for _, m := range dlq {
		got = append(got, fmt.Sprintf("%s kind %s from %s", header(m, wire.HeaderIdempotencyKey), header(m, wire.HeaderErrorKind), header(m, wire.HeaderOriginalTopic)))
	}
	if len(dlq) != 1 || header(dlq[0], wire.HeaderIdempotencyKey) != "M" || header(dlq[0], wire.HeaderErrorKind) != "expired" ||
		header(dlq[0], wire.HeaderOriginalTopic) != e.topic {
		t.Errorf("DLQ for a read_committed reader: %v, want M once, kind expired, from %s", got, e.topic)
	}
	if n := run.hooks.get("M"); n != 1 {
		t.Errorf("OnExpired ran %d times for M, want 1", n)
	}
}

// deferredRun is what deferThenExpire saw: the DLQ for a read_committed
// reader, and the OnExpired runs and handler deferrals by key.
type deferredRun struct {
	dlq              []*sarama.ConsumerMessage
	hooks, deferrals *calls
}

// deferThenExpire runs the deferral-then-expiry crossing with
// Transactions: M (deadline) is deferred past its deadline, the
// transaction carrying its offset aborts (at abortAt, once M was deferred),
// and B is an ordinary payment. hold, when set, wraps the PostgreSQL inbox
// (given the deferrals so far). It waits until the deferred copy was
// published and handled and every offset committed, then stops the
// consumer and checks that a transaction was aborted.
func deferThenExpire(t *testing.T, deadline, abortAt time.Time, hold func(deferrals *calls) func(ctx context.Context, key string) error) (*env, deferredRun) {
	t.Helper()
	e := newEnv(t, 1)
	deferred := e.topic + "." + e.group + ".deferred"
	t.Cleanup(func() { e.k.DeleteTopics(t, deferred) })
	cfg := txnConfig(e.config(), "")
	cfg.Defer = &schedule.Scheduler{Pool: e.pool}
	run := deferredRun{hooks: &calls{}, deferrals: &calls{}}
	cfg.Expiry.OnExpired = expiredHooks(run.hooks)
	if hold != nil {
		cfg.Dedupe = heldStore{Postgres: dedupe.NewPostgres(e.pool), hold: hold(run.deferrals)}
	}
	var aborted atomic.Bool
	ctx := consumer.WithBeforeCommitHook(testenv.Context(t), abortOnceAfter(t, func() bool {
		return run.deferrals.get("M") > 0
	}, abortAt, &aborted))
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "M" {
			run.deferrals.inc("M")
			return handler.DeferUntil(deadline.Add(2 * time.Second)) // past the deadline: the copy comes back expired
		}
		return eff(ctx, m)
	})
	e.produceExpiry(expiryRec{ikey: "M", deadline: strconv.FormatInt(deadline.UnixMilli(), 10)}, expiryRec{ikey: "B"})
	r := startCtx(t, ctx, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.total(deferred, 1); n < 1 {
			return errors.New("no deferred copy published yet")
		}
		if n := e.count(`SELECT count(*) FROM idem_deferred`); n != 0 {
			return fmt.Errorf("%d deferred rows left", n)
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 60*time.Second)
	e.waitCommitted(deferred, 1, 60*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if !aborted.Load() {
		t.Fatal("no transaction was aborted")
	}
	run.dlq = e.records(e.dlq(), sarama.ReadCommitted)
	return e, run
}

// Swarm (issue 28, phase 2, "the refusal memory"): with Transactions, a
// record the dead-letter topic refuses costs one aborted transaction, and
// its next try starts at the next form (a stub). Several such records of
// one partition must each cost one: the member remembered a refusal until
// the record's stub was sent, not until it committed, so each abort (for
// the next record's refusal) forgot the earlier record's, which was refused
// again in the next session: 2^n - 1 aborts for n records, and with records
// on several partitions of one transaction the partition never moved (the
// hardening check's stall: "partition stalled on one message").
func TestCrossingRefusalsOfOnePartitionAbortOnceEach(t *testing.T) {
	t.Parallel()
	const n = 4
	e := newEnv(t, 1)
	small := "10000"
	if err := e.k.Admin(t).CreateTopic(e.dlq(), &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"max.message.bytes": &small}}, false); err != nil {
		t.Fatal(err)
	}
	e.k.WaitTopic(t, e.dlq(), 1)
	var refused atomic.Int32
	ctx := consumer.WithAfterSendHook(testenv.Context(t), func(rec forward.Record, err error) {
		if err != nil && forward.IsPermanentForwardError(err) {
			refused.Add(1)
		}
	})
	cfg := txnConfig(e.config(), "")
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if strings.HasPrefix(m.IdempotencyKey, "big-") {
			return handler.Permanent(errors.New("poison, too large for the DLQ"))
		}
		return eff(ctx, m)
	})
	p := e.bigProducer()
	var want []string
	for i := range n {
		ik := fmt.Sprintf("big-%d", i)
		want = append(want, ik)
		for _, rec := range []struct {
			ikey  string
			value []byte
		}{{ik, make([]byte, 20000)}, {fmt.Sprintf("ok-%d", i), []byte(`{}`)}} {
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder(rec.ikey),
				Value: sarama.ByteEncoder(rec.value), Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(rec.ikey)}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	r := startCtx(t, ctx, cfg, h)
	e.waitCommitted(e.topic, 1, 120*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if got := refused.Load(); got != n {
		t.Errorf("the DLQ refused %d sends for %d records too large for it, want %d (one aborted transaction each)", got, n, n)
	}
	got := e.ikeyCopies(e.dlq())
	for _, ik := range want {
		if got[ik] != 1 {
			t.Errorf("%s: %d DLQ copies for a read_committed reader, want 1 (all: %v)", ik, got[ik], got)
		}
	}
}

// Swarm (issue 28, phase 2; seed 1015): with Ordering and Transactions, X
// fails into its tier and its tier copy fails again, to the DLQ; the
// drain behind X unblocks the key, and H, a later record of the key, fails
// and becomes its head. The transaction carrying X's DLQ forward aborts:
// X's tier copy is read again, finds H the head, and is parked behind it.
// When H is done and X's turn comes, X goes on from the tier it was read
// from: one copy in tier 1 and one in the DLQ for a read_committed reader.
// (The drain took a parked tier copy for a fresh message: X climbed the
// ladder again from tier 1, two tier-1 copies.)
func TestCrossingParkedTierCopyKeepsItsHop(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"txn", "txn-lanes"}, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 300*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		var xDLQ atomic.Bool
		ctx := consumer.WithAfterSendHook(testenv.Context(t), func(rec forward.Record, err error) {
			if err == nil && rec.Topic == e.dlq() && ikeyOf(rec) == "X" {
				xDLQ.Store(true)
			}
		})
		var aborted atomic.Bool
		ctx = consumer.WithBeforeCommitHook(ctx, func(records int) error {
			if aborted.Load() || !xDLQ.Load() {
				return nil
			}
			aborted.Store(true)
			// Hold the commit carrying X's DLQ forward until H is the key's
			// head (H's block is not in the transaction), then abort it.
			testenv.Eventually(t, 20*time.Second, func() error {
				if e.count(`SELECT count(*) FROM idem_ordering_heads WHERE head_key = 'H'`) == 0 {
					return errors.New("H is not the head yet")
				}
				return nil
			})
			return errors.New("forced abort of the transaction carrying X's DLQ forward")
		})
		var c calls
		produced := make(chan struct{})
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			n := c.inc(m.IdempotencyKey)
			switch {
			case m.IdempotencyKey == "X":
				if n == 2 { // X's tier copy: H follows now, into the same transaction
					select {
					case produced <- struct{}{}:
					default:
					}
				}
				return errors.New("X fails everywhere")
			case m.IdempotencyKey == "H" && m.Topic == e.topic:
				return errors.New("H fails at its source")
			}
			return apply(ctx, m)
		})
		p := e.k.Producer(t)
		e.send(p, 0, []byte("K"), "X")
		r := startCtx(t, ctx, cfg, h)
		select {
		case <-produced:
		case <-time.After(60 * time.Second):
			t.Fatal("X's tier copy never came")
		}
		e.send(p, 0, []byte("K"), "H")
		e.waitSettled("H")
		e.waitCommitted(e.topic, 1, 60*time.Second)
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if !aborted.Load() {
			t.Fatal("no transaction was aborted")
		}
		if got := e.ikeyCopies(e.tier(1)); got["X"] != 1 {
			t.Errorf("X: %d copies in tier 1 for a read_committed reader, want 1 (all: %v)", got["X"], got)
		}
		e.checkOnceInDLQ("X")
	})
}

// The variant of TestCrossingDeferredThenExpiredDeadLetteredOnce in which
// the redelivered source copy is live when it is read and expires before
// its handler call (a wait inside the store's unit of work, after the
// expiry check): the check at the call must ask what decide asks, the
// inbox for the message and for its deferral, so the copy is a duplicate
// of its deferred self, and M is dead-lettered once, by its deferred copy
// (found by the hour's soak, seed 1796388943105795477: two `expired` DLQ
// copies of deferred records).
func TestCrossingDeferredThenExpiredAtTheCall(t *testing.T) {
	t.Parallel()
	deadline := time.Now().Add(4 * time.Second)
	// M's redelivery waits inside the store until its deadline has passed:
	// it was live when read.
	_, run := deferThenExpire(t, deadline, time.Now(), func(deferrals *calls) func(ctx context.Context, key string) error {
		return func(ctx context.Context, key string) error {
			if key != "M" || deferrals.get("M") == 0 {
				return nil
			}
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for !time.Now().After(deadline) {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
	})
	if n := run.deferrals.get("M"); n != 1 {
		t.Errorf("M's handler ran %d times, want once (its redelivery expired before the call)", n)
	}
	dlq := run.dlq
	var got []string
	for _, m := range dlq {
		got = append(got, fmt.Sprintf("%s kind %s", header(m, wire.HeaderIdempotencyKey), header(m, wire.HeaderErrorKind)))
	}
	if len(dlq) != 1 || header(dlq[0], wire.HeaderIdempotencyKey) != "M" || header(dlq[0], wire.HeaderErrorKind) != "expired" {
		t.Errorf("DLQ for a read_committed reader: %v, want M once, kind expired", got)
	}
	if n := run.hooks.get("M"); n != 1 {
		t.Errorf("OnExpired ran %d times for M, want 1", n)
	}
}

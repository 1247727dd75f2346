package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// Issue 21 test 4 (and the expiry part of test 7): Config.Expiry on real
// Kafka and PostgreSQL.

// expiryRec is one record for the expiry tests: its idempotency key (also
// its Kafka key unless kafkaKey is set), its timestamp (zero: now) and an
// idem-deadline header value ("": none).
type expiryRec struct {
	ikey, kafkaKey string
	ts             time.Time
	deadline       string
}

func (e *env) produceExpiry(recs ...expiryRec) {
	e.t.Helper()
	p := e.k.Producer(e.t)
	for _, r := range recs {
		key := r.kafkaKey
		if key == "" {
			key = r.ikey
		}
		hs := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(r.ikey)}}
		if r.deadline != "" {
			hs = append(hs, sarama.RecordHeader{Key: []byte("idem-deadline"), Value: []byte(r.deadline)})
		}
		m := &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(r.ikey), Headers: hs, Timestamp: r.ts}
		if _, _, err := p.SendMessage(m); err != nil {
			e.t.Fatal(err)
		}
	}
}

// dlqKinds reads n records of the test's DLQ and returns idempotency key →
// idem-error-kind.
func (e *env) dlqKinds(n int) map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, r := range e.coreReadRecords(e.dlq(), 0, n, 60*time.Second) {
		out[header(r, "idempotency-key")] = header(r, wire.HeaderErrorKind)
	}
	return out
}

// waitClaimed waits until the member registered on e.reg has claimed a
// partition, so a test's clock starts when the consumer reads.
func (e *env) waitClaimed() {
	e.t.Helper()
	testenv.Eventually(e.t, 60*time.Second, func() error {
		if coreClaimed(e.t, e.reg) == 0 {
			return errors.New("no partition claimed yet")
		}
		return nil
	})
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// TestExpiryDeadLettersWithoutHandling: records older than the topic's
// maximum age and records past their idem-deadline go to the DLQ with kind
// "expired", a deadline that is not a time with kind "invalid-header", and
// none reaches the handler; the live records around them are handled (the
// partition does not stall).
func TestExpiryDeadLettersWithoutHandling(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	now := time.Now()
	e.produceExpiry(
		expiryRec{ikey: "old-1", ts: now.Add(-3 * time.Hour)},
		expiryRec{ikey: "live-1"},
		expiryRec{ikey: "old-2", ts: now.Add(-2 * time.Hour)},
		expiryRec{ikey: "past-deadline", deadline: ms(now.Add(-time.Minute))},
		expiryRec{ikey: "rfc-deadline", deadline: now.Add(-time.Minute).UTC().Format(time.RFC3339)},
		expiryRec{ikey: "bad-deadline", deadline: "tomorrow"},
		expiryRec{ikey: "future-deadline", deadline: ms(now.Add(time.Hour))},
		expiryRec{ikey: "live-2", ts: now.Add(-30 * time.Minute)},
	)
	cfg := e.config()
	cfg.Expiry = consumer.Expiry{MaxAge: time.Hour}
	var c calls
	eff := effectHandler()
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		c.inc(m.IdempotencyKey)
		return eff(ctx, m)
	}))
	e.waitCommitted(e.topic, 1, 60*time.Second)

	want := map[string]string{
		"old-1": "expired", "old-2": "expired", "past-deadline": "expired", "rfc-deadline": "expired",
		"bad-deadline": "invalid-header",
	}
	got := e.dlqKinds(len(want))
	for k, kind := range want {
		if got[k] != kind {
			t.Errorf("DLQ record %s: kind %q, want %q (all: %v)", k, got[k], kind, got)
		}
		if n := c.get(k); n != 0 {
			t.Errorf("handler called %d times for %s, want 0", n, k)
		}
	}
	if n := e.total(e.dlq(), 1); n != int64(len(want)) {
		t.Errorf("DLQ holds %d records, want %d", n, len(want))
	}
	for _, k := range []string{"live-1", "live-2", "future-deadline"} {
		if n := e.count(`SELECT count(*) FROM effects WHERE key = $1`, k); n != 1 {
			t.Errorf("%s applied %d times, want 1", k, n)
		}
	}
	if got := gatherSum(t, e.reg, "idem_expired_total", map[string]string{"action": coremetrics.ExpiredDeadLettered}); got != 4 {
		t.Errorf("idem_expired_total{action=dead_lettered} = %v, want 4", got)
	}
	if got := gatherSum(t, e.reg, "idem_forwarded_total", map[string]string{"kind": "expired"}); got != 4 {
		t.Errorf("idem_forwarded_total{kind=expired} = %v, want 4", got)
	}
}

// TestExpiryDropCounts: with Expiry.Drop an expired record is dropped and
// counted, not dead-lettered; an invalid deadline is still dead-lettered.
func TestExpiryDropCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	now := time.Now()
	e.produceExpiry(
		expiryRec{ikey: "old", ts: now.Add(-3 * time.Hour)},
		expiryRec{ikey: "past-deadline", deadline: ms(now.Add(-time.Minute))},
		expiryRec{ikey: "bad-deadline", deadline: "1.5"},
		expiryRec{ikey: "live"},
	)
	cfg := e.config()
	cfg.Expiry = consumer.Expiry{MaxAgeByTopic: map[string]time.Duration{e.topic: time.Hour}, Drop: true}
	var c calls
	eff := effectHandler()
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		c.inc(m.IdempotencyKey)
		return eff(ctx, m)
	}))
	e.waitCommitted(e.topic, 1, 60*time.Second)
	if got := e.dlqKinds(1); got["bad-deadline"] != "invalid-header" {
		t.Errorf("DLQ: %v, want bad-deadline with kind invalid-header", got)
	}
	if n := e.total(e.dlq(), 1); n != 1 {
		t.Errorf("DLQ holds %d records, want 1 (the invalid header; expired ones are dropped)", n)
	}
	for _, k := range []string{"old", "past-deadline", "bad-deadline"} {
		if n := c.get(k); n != 0 {
			t.Errorf("handler called %d times for %s, want 0", n, k)
		}
	}
	if n := e.count(`SELECT count(*) FROM effects WHERE key = 'live'`); n != 1 {
		t.Errorf("live applied %d times, want 1", n)
	}
	if got := gatherSum(t, e.reg, "idem_expired_total", map[string]string{"action": coremetrics.ExpiredDropped}); got != 2 {
		t.Errorf("idem_expired_total{action=dropped} = %v, want 2", got)
	}
	if got := coreOutcome(t, e.reg, coremetrics.OutcomeExpired); got != 2 {
		t.Errorf("idem_messages_total{outcome=expired} = %d, want 2", got)
	}
}

// TestExpiryThroughATier: a record that fails once goes to a retry tier;
// its deadline passes while it waits there, so when it comes due it is
// dead-lettered with kind "expired" and the handler is not called again.
func TestExpiryThroughATier(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{6 * time.Second}}
	var c calls
	eff := effectHandler()
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		if c.inc(m.IdempotencyKey) == 1 && m.IdempotencyKey == "a" {
			return errors.New("first attempt fails")
		}
		return eff(ctx, m)
	}))
	e.waitClaimed()
	produced := time.Now()
	e.produceExpiry(expiryRec{ikey: "a", deadline: ms(produced.Add(3 * time.Second))}, expiryRec{ikey: "b"})
	e.waitCommitted(e.topic, 1, 60*time.Second)
	if got := e.dlqKinds(1); got["a"] != "expired" {
		t.Fatalf("DLQ: %v, want a with kind expired", got)
	}
	if n := e.total(e.tier(1), 1); n != 1 {
		t.Errorf("tier 1 got %d records, want 1", n)
	}
	if n := c.get("a"); n != 1 {
		t.Errorf("handler called %d times for a, want 1 (the first attempt, before its deadline; never from the tier)", n)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects = %d, want 1 (b)", n)
	}
	if d := time.Since(produced); d < 3*time.Second {
		t.Fatalf("dead-lettered %s after producing, before its deadline", d)
	}
}

// TestExpiryOrdering: in ordering mode, an expired record of a blocked key
// is dead-lettered instead of parked, and a parked record whose deadline
// passes while it waits is dead-lettered when its turn comes; neither is
// handled, and the key's live records keep their order.
func TestExpiryOrdering(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := testenv.Context(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE applied(seq bigserial primary key, ikey text)`); err != nil {
		t.Fatal(err)
	}
	cfg := e.config()
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{6 * time.Second}}
	cfg.Ordering = consumer.ByKey(e.pool)
	var c calls
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		if c.inc(m.IdempotencyKey) == 1 && m.IdempotencyKey == "A1" {
			return errors.New("first attempt fails")
		}
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO applied(ikey) VALUES ($1)`, m.IdempotencyKey)
		return err
	}))
	e.waitClaimed()
	produced := time.Now()
	e.produceExpiry(
		expiryRec{ikey: "A1", kafkaKey: "A"},
		expiryRec{ikey: "A2", kafkaKey: "A", deadline: ms(produced.Add(-time.Minute))},    // expired: not parked
		expiryRec{ikey: "A3", kafkaKey: "A"},                                              // parked
		expiryRec{ikey: "A4", kafkaKey: "A", deadline: ms(produced.Add(3 * time.Second))}, // parked live, expires while parked
		expiryRec{ikey: "A5", kafkaKey: "A"},
	)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM applied`); n != 3 {
			return fmt.Errorf("%d applied", n)
		}
		return nil
	})
	var got string
	if err := e.pool.QueryRow(ctx, `SELECT string_agg(ikey, ',' ORDER BY seq) FROM applied`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != "A1,A3,A5" {
		t.Errorf("applied %s, want A1,A3,A5", got)
	}
	kinds := e.dlqKinds(2)
	if kinds["A2"] != "expired" || kinds["A4"] != "expired" {
		t.Errorf("DLQ: %v, want A2 and A4 with kind expired", kinds)
	}
	for _, k := range []string{"A2", "A4"} {
		if n := c.get(k); n != 0 {
			t.Errorf("handler called %d times for %s, want 0", n, k)
		}
	}
	if n := coreOutcome(t, e.reg, coremetrics.OutcomeParked); n != 3 {
		t.Errorf("idem_messages_total{outcome=parked} = %d, want 3 (A3, A4, A5; not the expired A2)", n)
	}
}

// TestExpiryRejectsNegativeAge: a negative maximum age is a start error
// naming the field (issue 21 test 7).
func TestExpiryRejectsNegativeAge(t *testing.T) {
	for name, x := range map[string]consumer.Expiry{
		"MaxAge":        {MaxAge: -time.Second},
		"MaxAgeByTopic": {MaxAgeByTopic: map[string]time.Duration{"t": -time.Minute}},
	} {
		cfg := coreValidConfig()
		cfg.Expiry = x
		err := consumer.Run(context.Background(), cfg, handler.Func(func(context.Context, *handler.Message) error { return nil }))
		if !slices.Contains(coreConfigFields(err), "Expiry") {
			t.Errorf("%s: Run = %v, want a problem of Expiry", name, err)
		}
	}
}

// A message whose deadline passes while it is retried in process (found by
// the hour's swarm soak: a deadline record handled 14.8 s past its
// deadline, its attempts spaced by waits) is not handled again: the next
// attempt finds it expired, and it is dead-lettered with kind expired,
// not retried until its attempts run out.
func TestDeadlinePassingBetweenAttempts(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"", "txn"}, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		cfg := mode.apply(e.config())
		cfg.Retry.Attempts = 100
		cfg.Retry.Backoff = recovery.Backoff{Base: 100 * time.Millisecond, Max: 100 * time.Millisecond}
		var deadline atomic.Int64
		var late atomic.Int32
		start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
			if time.Now().UnixMilli() > deadline.Load() {
				late.Add(1)
			}
			return errors.New("the dependency fails until the deadline has passed")
		}))
		e.produceExpiry(expiryRec{ikey: "warm-up", deadline: ms(time.Now().Add(-time.Minute))}) // expired: dead-lettered at once
		e.waitCommitted(e.topic, 1, 60*time.Second)
		d := time.Now().Add(time.Second)
		deadline.Store(d.UnixMilli())
		e.produceExpiry(expiryRec{ikey: "m", deadline: ms(d)})
		e.waitCommitted(e.topic, 1, 60*time.Second)
		if got := e.dlqKinds(2); got["m"] != "expired" {
			t.Errorf("DLQ kinds %v: want m with kind expired (its deadline passed between attempts)", got)
		}
		if n := late.Load(); n > 1 { // one attempt may start in the moment the deadline passes
			t.Errorf("the handler was called %d times past the deadline", n)
		}
	})
}

// A copy of a message applied elsewhere while this one waits between
// attempts (a rebalance's redelivery on another member, found by the hour's
// swarm soak without Transactions: one copy applied, the other
// dead-lettered as expired) makes this one a duplicate when its deadline
// then passes: the inbox is asked before it is called expired, as it is
// before the first attempt, so the record has one outcome.
func TestExpiredBetweenAttemptsAfterAnotherCopyApplied(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"", "txn"}, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		cfg := mode.apply(e.config())
		failing := make(chan struct{})
		var once atomic.Bool
		var hooked atomic.Int32
		cfg.Expiry.OnExpired = func(context.Context, consumer.Expired) error { hooked.Add(1); return nil }
		start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
			switch {
			case m.IdempotencyKey == "warm-up":
				return nil
			case m.IdempotencyKey == "m" && once.CompareAndSwap(false, true):
				close(failing)
				// This copy waits 5 s for its dependency, past its deadline.
				return &breaker.ThrottleError{Name: "psp", Reason: breaker.ReasonRate, RetryAfter: 5 * time.Second}
			}
			return errors.New("called again: the deadline has passed")
		}))
		// m's deadline starts once the consumer reads: on a loaded machine
		// (a clean-clone CI run beside a chaos run) joining the group took
		// longer than m's 1.5 s, and m expired before its first call.
		e.produceExpiry(expiryRec{ikey: "warm-up"})
		e.waitCommitted(e.topic, 1, 60*time.Second)
		e.produceExpiry(expiryRec{ikey: "m", deadline: ms(time.Now().Add(3 * time.Second))})
		select {
		case <-failing:
		case <-time.After(60 * time.Second):
			t.Fatal("the handler was never called for m")
		}
		// The other copy: applied in the inbox by another member, before the deadline.
		other := dedupe.Record{Group: cfg.Group, Key: "m", Topic: e.topic, Partition: 0, Offset: 1}
		if out, err := dedupe.NewPostgres(e.pool).Process(context.Background(), other, func(context.Context) error { return nil }); err != nil || out != dedupe.Processed {
			t.Fatalf("applying the other copy: %v, %v", out, err)
		}
		e.produceExpiry(expiryRec{ikey: "tail", deadline: ms(time.Now().Add(-time.Minute))}) // expired: dead-lettered once m is done
		e.waitCommitted(e.topic, 1, 60*time.Second)
		if got := e.dlqKinds(1); got["tail"] != "expired" || got["m"] != "" {
			t.Errorf("DLQ kinds %v: want only tail (m was applied by its other copy)", got)
		}
		if n := hooked.Load(); n != 1 {
			t.Errorf("OnExpired ran %d times, want once (for tail only)", n)
		}
	})
}

// heldStore is the PostgreSQL inbox with a wait inside its unit of work,
// after the claim and before the handler's call, for the records hold
// names: the wait a row lock held by another member's transaction, a pool
// that has no connection free, or a slow BEGIN makes.
type heldStore struct {
	*dedupe.Postgres
	hold func(ctx context.Context, key string) error
}

func (s heldStore) Process(ctx context.Context, rec dedupe.Record, fn func(ctx context.Context) error) (dedupe.Outcome, error) {
	return s.Postgres.Process(ctx, rec, func(ctx context.Context) error {
		if err := s.hold(ctx, rec.Key); err != nil {
			return err
		}
		return fn(ctx)
	})
}

func (s heldStore) ProcessBatch(ctx context.Context, recs []dedupe.Record, fn func(ctx context.Context, fresh []int) error) ([]dedupe.Outcome, error) {
	return s.Postgres.ProcessBatch(ctx, recs, func(ctx context.Context, fresh []int) error {
		for _, i := range fresh {
			if err := s.hold(ctx, recs[i].Key); err != nil {
				return err
			}
		}
		return fn(ctx, fresh)
	})
}

// A deadline that passes after the expiry check and before the handler's
// call, in a wait inside the store's unit of work, ends the message as
// expired without calling the handler (the swarm: batches handled 14 s to
// a minute past their records' deadline or maximum age, after waits that
// checked nothing). The check stands right before the call, so every wait
// before it is covered: the breaker's gate, an adaptive lane, the store,
// a transaction.
func TestDeadlinePassingBeforeTheCall(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"", "batch", "txn"}, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		cfg := mode.apply(e.config())
		var deadline atomic.Int64
		deadline.Store(time.Now().Add(time.Hour).UnixMilli())
		cfg.Dedupe = heldStore{Postgres: dedupe.NewPostgres(e.pool), hold: func(ctx context.Context, key string) error {
			if key != "m" {
				return nil
			}
			// The store holds m until its deadline has passed (the clock,
			// not a sleep, says when).
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for time.Now().UnixMilli() <= deadline.Load() {
				select {
				case <-tick.C:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}}
		var late, handled atomic.Int32
		start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "m" && time.Now().UnixMilli() > deadline.Load() {
				late.Add(1)
			}
			handled.Add(1)
			return nil
		}))
		d := time.Now().Add(time.Second)
		deadline.Store(d.UnixMilli())
		e.produceExpiry(expiryRec{ikey: "m", deadline: ms(d)}, expiryRec{ikey: "n", deadline: ms(time.Now().Add(time.Hour))})
		e.waitCommitted(e.topic, 1, 60*time.Second)
		if n := late.Load(); n != 0 {
			t.Errorf("m was handled %d times past its deadline", n)
		}
		if got := e.dlqKinds(1); got["m"] != "expired" {
			t.Errorf("DLQ kinds %v: want m with kind expired", got)
		}
		if n := handled.Load(); n != 1 {
			t.Errorf("the handler ran %d times, want once (n)", n)
		}
	})
}

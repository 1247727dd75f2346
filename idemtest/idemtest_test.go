package idemtest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

func TestExampleOrders(t *testing.T) {
	t.Parallel()
	testOrders(t)
}

// TestRetryTierAndDLQ: a handler failing twice succeeds from the first retry
// tier; one that always fails reaches the dead-letter topic with its
// original coordinates, and the kit reads it back.
func TestRetryTierAndDLQ(t *testing.T) {
	t.Parallel()
	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "payments", 2)
	k.Produce(t, "payments",
		idemtest.Record{Partition: 0, IdempotencyKey: "flaky", Key: []byte("acct-1"), Value: []byte("1")},
		idemtest.Record{Partition: 1, IdempotencyKey: "broken", Key: []byte("acct-2"), Value: []byte("2"),
			Headers: []handler.Header{{Key: "trace", Value: []byte("t-1")}}},
	)
	cfg := k.Config(t, "billing", "payments")
	cfg.Retry.Attempts = 2
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{50 * time.Millisecond}}
	var origins atomic.Int64
	c := idemtest.Start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Origin().Topic == "payments" {
			origins.Add(1)
		}
		if m.IdempotencyKey == "flaky" && m.Attempt < 3 {
			return errors.New("not yet")
		}
		if m.IdempotencyKey == "broken" {
			return fmt.Errorf("attempt %d: bank down", m.Attempt)
		}
		return nil
	}))
	c.WaitOutcome(t, "processed", 1)
	c.WaitOutcome(t, "dead_lettered", 1)
	dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ("payments", "billing"), 1)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	d := dl[0]
	if string(d.Key) != "acct-2" || string(d.Value) != "2" || d.Partition != 1 ||
		d.Failure.OriginalTopic != "payments" || d.Failure.OriginalPartition != 1 || d.Failure.Attempt != 4 ||
		d.Failure.Kind != handler.KindRetriable || d.Failure.Error != "attempt 4: bank down" {
		t.Errorf("dead letter = %+v", d)
	}
	if len(d.Headers) != 2 || d.Headers[0].Key != "idempotency-key" || d.Headers[1].Key != "trace" {
		t.Errorf("original headers = %+v", d.Headers)
	}
	if outs := c.Outcomes(t); outs["retried"] != 2 {
		t.Errorf("outcomes %v: want 2 forwards to the retry tier", outs)
	}
	if origins.Load() != 7 { // flaky 3 attempts, broken 4: all name the source topic
		t.Errorf("%d calls named the source topic in Origin, want 7", origins.Load())
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
}

// TestWithPostgres: the transactional inbox on the kit's cluster; a
// redelivered key has one effect, written through dedupe.Tx.
func TestWithPostgres(t *testing.T) {
	t.Parallel()
	pool, _ := testenv.PostgresSchema(t)
	ctx := context.Background()
	table := testenv.Unique("shipments")
	if _, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (order_id text)`, table)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), `DROP TABLE `+table) })
	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "orders", 1)
	group := testenv.Unique("shipping")
	cfg := idemtest.WithPostgres(t, k.Config(t, group, "orders"), pool)
	cfg.KeyFunc = consumer.JSONField("id")
	k.Produce(t, "orders",
		idemtest.Record{Value: []byte(`{"id":"o-1"}`)},
		idemtest.Record{Value: []byte(`{"id":"o-1"}`)},
		idemtest.Record{Value: []byte(`{"id":"o-2"}`)},
	)
	c := idemtest.Start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, m.IdempotencyKey)
		return err
	}))
	c.WaitHandled(t, 3)
	if outs := c.Outcomes(t); outs["processed"] != 2 || outs["duplicate"] != 1 {
		t.Errorf("outcomes %v, want 2 processed and 1 duplicate", outs)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d shipments (err %v), want 2", n, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_processed WHERE consumer_group = $1`, group).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d inbox rows (err %v), want 2", n, err)
	}
}

// TestStartBatchHandler: a handler.Batch handler through the kit.
func TestStartBatchHandler(t *testing.T) {
	t.Parallel()
	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "events", 1)
	var recs []idemtest.Record
	for i := range 20 {
		recs = append(recs, idemtest.Record{IdempotencyKey: fmt.Sprint("e-", i), Value: []byte("{}")})
	}
	k.Produce(t, "events", recs...)
	var seen atomic.Int64
	c := idemtest.Start(t, k.Config(t, "audit", "events"), handler.Batch(func(ctx context.Context, ms []*handler.Message) error {
		seen.Add(int64(len(ms)))
		return nil
	}))
	c.WaitOutcome(t, "processed", 20)
	if seen.Load() != 20 {
		t.Fatalf("batch handler saw %d messages, want 20", seen.Load())
	}
}

// TestBatchErrorNamingACopyIsNotLost: a batch handler whose *BatchError names
// a copy of the message instead of the message itself (so it names none of
// the batch) must not see that message recorded as processed with no
// effect: it takes the failure path and reaches the DLQ.
func TestBatchErrorNamingACopyIsNotLost(t *testing.T) {
	t.Parallel()
	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "ledger", 1)
	k.Produce(t, "ledger", idemtest.Record{IdempotencyKey: "entry-1", Value: []byte("{}")})
	cfg := k.Config(t, "books", "ledger")
	cfg.Retry.Attempts = 2
	c := idemtest.Start(t, cfg, handler.Batch(func(ctx context.Context, ms []*handler.Message) error {
		be := &handler.BatchError{}
		for _, m := range ms {
			cp := *m // a copy: not one of the messages the batch was given
			be.Add(&cp, errors.New("ledger locked"))
		}
		return be
	}))
	c.WaitOutcome(t, "dead_lettered", 1)
	if outs := c.Outcomes(t); outs["processed"] != 0 {
		t.Fatalf("outcomes %v: the failed message was recorded as processed", outs)
	}
	dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ("ledger", "books"), 1)
	if len(dl) != 1 || !strings.Contains(dl[0].Failure.Error, "ledger locked") {
		t.Fatalf("dead letters %+v, want entry-1 failing with the batch's error", dl)
	}
}

// TestForgottenWithPostgresIsAClearError: a handler that writes through
// dedupe.Tx(ctx) on a config without WithPostgres (the kit's default memory
// store has no transaction) fails with an error that names the missing
// store, dead-lettered at once as permanent, instead of a nil-pointer panic.
func TestForgottenWithPostgresIsAClearError(t *testing.T) {
	t.Parallel()
	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "refunds", 1)
	k.Produce(t, "refunds", idemtest.Record{IdempotencyKey: "r-1", Value: []byte("{}")})
	c := idemtest.Start(t, k.Config(t, "payouts", "refunds"), handler.Func(func(ctx context.Context, m *handler.Message) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO refunds (id) VALUES ($1)`, m.IdempotencyKey)
		if err != nil && (dedupe.HasTx(ctx) || !handler.IsPermanent(err)) {
			t.Errorf("error %v: want the permanent error of a ctx without a transaction", err)
		}
		return err
	}))
	c.WaitOutcome(t, "dead_lettered", 1)
	dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ("refunds", "payouts"), 1)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	f := dl[0].Failure
	if f.Kind != handler.KindPermanent || !strings.Contains(f.Error, "dedupe.NewPostgres") || !strings.Contains(f.Error, "idemtest.WithPostgres") {
		t.Fatalf("dead letter: kind %s, error %q; want a permanent error naming dedupe.NewPostgres and idemtest.WithPostgres", f.Kind, f.Error)
	}
}

// TestDeadLetterKeepsOutboxID: ReadDLQ drops only the wire contract's
// idem-* headers; a record published by outbox.Relay keeps its
// idem-outbox-id in DeadLetter.Headers, as the DLQ record does.
func TestDeadLetterKeepsOutboxID(t *testing.T) {
	t.Parallel()
	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "events", 1)
	k.Produce(t, "events", idemtest.Record{IdempotencyKey: "evt-1", Value: []byte("{}"),
		Headers: []handler.Header{{Key: "idem-outbox-id", Value: []byte("42")}}})
	c := idemtest.Start(t, k.Config(t, "audit", "events"), handler.Func(func(ctx context.Context, m *handler.Message) error {
		return handler.Permanent(errors.New("unknown event"))
	}))
	c.WaitOutcome(t, "dead_lettered", 1)
	dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ("events", "audit"), 1)
	var id string
	for _, h := range dl[0].Headers {
		if h.Key == "idem-outbox-id" {
			id = string(h.Value)
		}
		if wire.IsIdemHeader([]byte(h.Key)) {
			t.Errorf("wire-contract header %s kept in DeadLetter.Headers", h.Key)
		}
	}
	if id != "42" {
		t.Fatalf("DeadLetter.Headers = %+v, want idem-outbox-id 42 kept", dl[0].Headers)
	}
}

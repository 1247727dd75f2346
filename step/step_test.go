package step_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/step"
)

type receipt struct {
	ChargeID string `json:"charge_id"`
	Cents    int64  `json:"cents"`
}

// run calls fn with a handler's ctx of a consumer of group on pool, for a
// message with idempotency key key, and returns its error.
func run(pool *pgxpool.Pool, group, key string, fn func(ctx context.Context) error) error {
	return fn(step.WithScope(context.Background(), pool, group, key))
}

// A result is recorded once and returned to every later call without fn.
func TestDoRecordsOnce(t *testing.T) {
	testenv.SkipIfShort(t)
	pool := idemtest.ConnectPostgres(t).Pool
	var calls atomic.Int32
	var got []receipt
	for range 3 {
		err := run(pool, "g", "k-1", func(ctx context.Context) error {
			r, err := step.Do(ctx, "charge", func(ctx context.Context) (receipt, error) {
				calls.Add(1)
				return receipt{ChargeID: "ch_1", Cents: 1250}, nil
			})
			got = append(got, r)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 || got[0] != got[2] || got[2] != (receipt{"ch_1", 1250}) {
		t.Fatalf("fn called %d times, results %v; want once and the same result", calls.Load(), got)
	}
	// Another step, another message, another group: each its own.
	for _, id := range [][3]string{{"g", "k-1", "refund"}, {"g", "k-2", "charge"}, {"h", "k-1", "charge"}} {
		_ = run(pool, id[0], id[1], func(ctx context.Context) error {
			_, err := step.Do(ctx, id[2], func(ctx context.Context) (receipt, error) { calls.Add(1); return receipt{}, nil })
			return err
		})
	}
	if calls.Load() != 4 {
		t.Fatalf("fn called %d times, want 4: steps of other names, keys or groups are not the same step", calls.Load())
	}
}

// A permanent failure is recorded and returned again without fn; any other
// failure is not, and fn runs again.
func TestDoFailures(t *testing.T) {
	testenv.SkipIfShort(t)
	pool := idemtest.ConnectPostgres(t).Pool
	var calls atomic.Int32
	declined := func(ctx context.Context) error {
		_, err := step.Do(ctx, "charge", func(ctx context.Context) (string, error) {
			calls.Add(1)
			return "", handler.Permanent(errors.New("card declined"))
		})
		return err
	}
	for i := range 2 {
		err := run(pool, "g", "k-perm", declined)
		if !handler.IsPermanent(err) || !strings.Contains(err.Error(), "card declined") {
			t.Fatalf("call %d: %v; want a permanent error saying why", i, err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("a recorded permanent failure ran fn %d times, want once", calls.Load())
	}
	calls.Store(0)
	flaky := func(ctx context.Context) error {
		_, err := step.Do(ctx, "charge", func(ctx context.Context) (string, error) {
			if calls.Add(1) == 1 {
				return "", errors.New("timeout")
			}
			return "ch_2", nil
		})
		return err
	}
	if err := run(pool, "g", "k-flaky", flaky); err == nil || handler.IsPermanent(err) {
		t.Fatalf("first call: %v; want the retriable error", err)
	}
	if err := run(pool, "g", "k-flaky", flaky); err != nil || calls.Load() != 2 {
		t.Fatalf("second call: %v after %d calls; want fn run again and succeed", err, calls.Load())
	}
}

func TestKey(t *testing.T) {
	pool := &pgxpool.Pool{} // never used: Key reads no table
	keys := map[string]bool{}
	first := ""
	for _, id := range [][3]string{{"g", "k", "charge"}, {"g", "k", "charge"}, {"g", "k", "refund"}, {"g", "k2", "charge"}, {"h", "k", "charge"}} {
		_ = run(pool, id[0], id[1], func(ctx context.Context) error {
			k := step.Key(ctx, id[2])
			if first == "" {
				first = k
			}
			keys[k] = true
			return nil
		})
	}
	if len(keys) != 4 || !strings.HasPrefix(first, "idem-") || len(first) != 45 {
		t.Fatalf("keys %v (first %q): want 4 distinct idem-<40 hex> keys for 5 calls, two of them the same step", keys, first)
	}
	if k := step.Key(context.Background(), "charge"); k != "" {
		t.Fatalf("Key outside a handler's ctx = %q, want \"\"", k)
	}
}

// Outside a handler's ctx, with a store without a database, with an empty
// name, or in a batch handler without For, Do fails and does not call fn.
func TestDoNeedsScope(t *testing.T) {
	pool := &pgxpool.Pool{}
	fn := func(ctx context.Context) (int, error) { t.Fatal("fn called"); return 0, nil }
	if _, err := step.Do(context.Background(), "charge", fn); err == nil || !strings.Contains(err.Error(), "not a handler's ctx") {
		t.Fatalf("outside a handler: %v", err)
	}
	if _, err := step.Do(step.WithScope(context.Background(), nil, "g", "k"), "charge", fn); err == nil || !strings.Contains(err.Error(), "no database") {
		t.Fatalf("memory store: %v", err)
	}
	if err := run(pool, "g", "k", func(ctx context.Context) error { _, err := step.Do(ctx, "", fn); return err }); err == nil {
		t.Fatal("empty name: no error")
	}
	batch := step.WithScope(context.Background(), pool, "g", "")
	if _, err := step.Do(batch, "charge", fn); err == nil || !strings.Contains(err.Error(), "step.For") {
		t.Fatalf("batch without For: %v", err)
	}
	m := &handler.Message{IdempotencyKey: "k"}
	if step.Key(step.For(batch, m), "charge") != step.Key(step.WithScope(context.Background(), pool, "g", "k"), "charge") {
		t.Fatal("For(ctx, m) does not name m as a handler's ctx for m does")
	}
	if ctx := context.Background(); step.For(ctx, m) != ctx {
		t.Fatal("For outside a handler's ctx changed it")
	}
}

// Steps in a batch handler: each message's step is its own (For),
// and when the batch fails after its steps and its messages run again, one
// by one, no step calls the bank again.
func TestStepInBatchHandler(t *testing.T) {
	testenv.SkipIfShort(t)
	e := newEnv(t)
	orders := []string{"order-1", "order-2", "order-3", "order-4", "order-5"}
	e.produce(t, orders...)
	pool := e.pg.Pool
	var batches atomic.Int32
	h := handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
		first := batches.Add(1) == 1
		for _, m := range msgs {
			mctx := step.For(ctx, m)
			chargeID, err := step.Do(mctx, "charge", func(ctx context.Context) (string, error) {
				return charge(ctx, pool, step.Key(ctx, "charge"))
			})
			if err != nil {
				return err
			}
			if _, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO effects (order_id, charge_id) VALUES ($1, $2)`, string(m.Value), chargeID); err != nil {
				return err
			}
		}
		if first {
			return errors.New("the first batch fails after its steps")
		}
		return nil
	})
	idemtest.Start(t, e.config(t), h)
	waitCount(t, pool, len(orders), `SELECT count(*) FROM effects`)
	if n := count(t, pool, `SELECT count(*) FROM bank_requests`); n != len(orders) {
		t.Fatalf("the bank saw %d requests for %d orders: a step ran again", n, len(orders))
	}
	if n := count(t, pool, `SELECT count(DISTINCT charge_id) FROM effects`); n != len(orders) {
		t.Fatalf("%d distinct charges for %d orders", n, len(orders))
	}
}

// Steps under Config.Transactions: a handler that fails after its step is
// retried, and the retry gets the recorded charge.
func TestStepUnderTransactions(t *testing.T) {
	testenv.SkipIfShort(t)
	e := newEnv(t)
	orders := []string{"order-1", "order-2", "order-3"}
	e.produce(t, orders...)
	pool := e.pg.Pool
	cfg := e.config(t)
	cfg.Transactions.Enabled = true
	failed := map[string]bool{}
	h := payments(pool, func(ctx context.Context, at string, m *handler.Message) error {
		if at == "after-step" && !failed[string(m.Value)] {
			failed[string(m.Value)] = true // one goroutine: one partition
			return fmt.Errorf("fails once after its step (attempt %d)", m.Attempt)
		}
		return nil
	})
	c := idemtest.Start(t, cfg, h)
	c.WaitOutcome(t, "processed", len(orders))
	waitCount(t, pool, len(orders), `SELECT count(*) FROM effects`)
	if n := count(t, pool, `SELECT count(*) FROM bank_requests`); n != len(orders) {
		t.Fatalf("the bank saw %d requests for %d orders: a retry called it again", n, len(orders))
	}
}

// Steps with more lanes than the store's pool has connections: each lane's
// handler holds a connection for its transaction while its step records on
// another, which a shared pool could not give (every lane waiting for a
// second connection, for ever); the consumer records steps through a pool
// of their own, so every payment is charged once and applied.
func TestStepsWithMoreLanesThanConnections(t *testing.T) {
	testenv.SkipIfShort(t)
	e := newEnv(t)
	cfg, err := pgxpool.ParseConfig(e.pg.URL)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	small, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	orders := make([]string, 40)
	for i := range orders {
		orders[i] = fmt.Sprintf("order-%02d", i)
	}
	e.produce(t, orders...)
	ccfg := idemtest.WithPostgres(t, e.kafka.Config(t, e.group, e.topic), small)
	ccfg.Concurrency = 8
	idemtest.Start(t, ccfg, payments(e.pg.Pool, nil))
	waitCount(t, e.pg.Pool, len(orders), `SELECT count(*) FROM effects`)
	if n := count(t, e.pg.Pool, `SELECT count(*) FROM bank_requests`); n != len(orders) {
		t.Fatalf("the bank saw %d requests for %d orders", n, len(orders))
	}
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
)

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

// Issue 18 #10: the batch handler names A1 in a *BatchError. A1 and A2
// share their lane key, and LaneBy promises their order: A2 must not be
// committed before A1's retry. A failed batch runs each message alone, in
// order.
func TestBatchHandlerErrorKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	e, cfg := batchEnv(t)
	var c calls
	h := handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
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
	start(t, cfg, h)
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
	cfg.Retry.Attempts = 1
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
	if got := header(m, wire.HeaderIdempotencyKey); got != "X" {
		t.Fatalf("dead-lettered %q, want X (Y is innocent)", got)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := e.applied(); got != "Y" {
			return fmt.Errorf("applied %q, want Y", got)
		}
		return nil
	})
}

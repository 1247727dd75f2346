package step_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/step"
)

// env is one test's topic, group and database, with the fake bank's tables.
type env struct {
	kafka *idemtest.Kafka
	pg    *idemtest.Postgres
	topic string
	group string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	k := idemtest.Connect(t)
	e := &env{kafka: k, pg: idemtest.ConnectPostgres(t), topic: k.Topic(t, "steps", 1), group: k.Group(t, "steps")}
	createBank(t, e.pg.Pool)
	return e
}

// The fake bank honours idempotency keys, as a payment service provider
// does: every request is logged (bank_requests), a key is charged once
// (bank_charges). It lives in the test's schema so that a child process and
// the test see the same bank; its writes commit at once, outside any
// handler's transaction, as a remote call's effect would.
func createBank(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
		CREATE TABLE bank_requests (key text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
		CREATE TABLE bank_charges (key text PRIMARY KEY, charge_id text NOT NULL);
		CREATE TABLE effects (order_id text NOT NULL, charge_id text NOT NULL)`)
	if err != nil {
		t.Fatal(err)
	}
}

// charge is the bank's one operation: charge once per key, and return the
// charge made for that key.
func charge(ctx context.Context, pool *pgxpool.Pool, key string) (string, error) {
	if key == "" {
		return "", handler.Permanent(fmt.Errorf("bank: no idempotency key"))
	}
	if _, err := pool.Exec(ctx, `INSERT INTO bank_requests (key) VALUES ($1)`, key); err != nil {
		return "", err
	}
	var id string
	err := pool.QueryRow(ctx, `INSERT INTO bank_charges (key, charge_id) VALUES ($1, 'ch_' || md5($1))
		ON CONFLICT (key) DO UPDATE SET key = EXCLUDED.key RETURNING charge_id`, key).Scan(&id)
	return id, err
}

// hook is called at a named stage of the payment handler: "after-bank"
// (inside the step, once the bank has charged, before the step's row) and
// "after-step" (the step recorded, before the handler's transaction
// commits). A crash child blocks there until it is killed; an error it
// returns is the step's (after-bank) or the handler's (after-step).
type hook func(ctx context.Context, stage string, m *handler.Message) error

// payments is the handler of the tests and of their crash children: it
// charges the order through a step with the step's derived key, then
// records the charge in the handler's transaction.
func payments(pool *pgxpool.Pool, at hook) handler.Handler {
	return handler.Func(func(ctx context.Context, m *handler.Message) error {
		chargeID, err := step.Do(ctx, "charge", func(ctx context.Context) (string, error) {
			id, err := charge(ctx, pool, step.Key(ctx, "charge"))
			if err == nil && at != nil {
				err = at(ctx, "after-bank", m)
			}
			return id, err
		})
		if err != nil {
			return err
		}
		if at != nil {
			if err := at(ctx, "after-step", m); err != nil {
				return err
			}
		}
		_, err = dedupe.Tx(ctx).Exec(ctx, `INSERT INTO effects (order_id, charge_id) VALUES ($1, $2)`, string(m.Value), chargeID)
		return err
	})
}

// count returns the one number a query selects.
func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitCount waits until the query selects want.
func waitCount(t *testing.T, pool *pgxpool.Pool, want int, sql string, args ...any) {
	t.Helper()
	idemtest.Eventually(t, time.Minute, func() error {
		if got := count(t, pool, sql, args...); got != want {
			return fmt.Errorf("%s: %d, want %d", strings.Join(strings.Fields(sql), " "), got, want)
		}
		return nil
	})
}

// config is the consumer's configuration on env, on the transactional inbox.
func (e *env) config(t *testing.T) consumer.Config {
	cfg := idemtest.WithPostgres(t, e.kafka.Config(t, e.group, e.topic), e.pg.Pool)
	cfg.Sarama.Consumer.Group.Session.Timeout = 6 * time.Second // a killed child is evicted soon
	cfg.Sarama.Consumer.Group.Heartbeat.Interval = time.Second
	return cfg
}

// produce writes one order per value, each with its own idempotency key.
func (e *env) produce(t *testing.T, values ...string) {
	t.Helper()
	recs := make([]idemtest.Record, len(values))
	for i, v := range values {
		recs[i] = idemtest.Record{IdempotencyKey: "pay-" + v, Value: []byte(v)}
	}
	e.kafka.Produce(t, e.topic, recs...)
}

func getenv(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set", name)
	}
	return v
}

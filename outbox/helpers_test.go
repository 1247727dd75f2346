package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/testing/testkit"
	"github.com/idemhq/idem/outbox"
)

// env is one test's broker, database schema (with the outbox table) and topic.
type env struct {
	t      testing.TB
	k      *idemtest.Kafka
	pool   *pgxpool.Pool
	schema string
	url    string // DATABASE_URL on schema; empty in a child
	topic  string
}

func newEnv(t testing.TB, partitions int32) *env {
	t.Helper()
	k := idemtest.Connect(t)
	db := idemtest.ConnectPostgres(t) // with idem_outbox
	return &env{t: t, k: k, pool: db.Pool, schema: db.Schema, url: db.URL, topic: k.Topic(t, "t", partitions)}
}

// admin returns a cluster admin on the test's broker, closed when the test
// ends.
func (e *env) admin() sarama.ClusterAdmin {
	e.t.Helper()
	return testkit.Admin(e.t, e.k.Brokers, e.k.SaramaConfig())
}

// relay returns a relay on the test's table tuned for quick tests, with a
// registry of its own.
func (e *env) relay(pool *pgxpool.Pool) (*outbox.Relay, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return &outbox.Relay{
		Pool:          pool,
		Brokers:       e.k.Brokers,
		Sarama:        e.k.SaramaConfig(),
		PollInterval:  500 * time.Millisecond,
		LeaderRetry:   100 * time.Millisecond,
		RetryBase:     10 * time.Millisecond,
		RetryMax:      100 * time.Millisecond,
		StatsInterval: 50 * time.Millisecond,
		Logger:        testLogger(e.t),
		Registerer:    reg,
	}, reg
}

// start runs r until the test ends (or stop is called) and checks it
// returned nil.
func start(t testing.TB, r *outbox.Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("relay.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// enqueue commits msgs in one transaction.
func (e *env) enqueue(msgs ...outbox.Message) { e.enqueueBy(outbox.Enqueue, msgs...) }

// enqueueBy commits msgs in one transaction through enqueue (outbox.Enqueue,
// or a Relay's Enqueue).
func (e *env) enqueueBy(enqueue func(context.Context, pgx.Tx, ...outbox.Message) error, msgs ...outbox.Message) {
	e.t.Helper()
	ctx := e.t.Context()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := enqueue(ctx, tx, msgs...); err != nil {
		e.t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) msg(key, value string) outbox.Message {
	return outbox.Message{Topic: e.topic, Key: []byte(key), Value: []byte(value)}
}

// count returns the rows of the outbox table matching where.
func (e *env) count(where string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), "SELECT count(*) FROM idem_outbox WHERE "+where, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// records collects every record of a topic, from the oldest, until the test ends.
type records struct {
	mu      sync.Mutex
	list    []*sarama.ConsumerMessage
	arrived []time.Time // when each record of list was read
}

func (e *env) consume(topic string) *records {
	e.t.Helper()
	return e.consumeAt(topic, sarama.ReadUncommitted)
}

// consumeAt is consume with the given isolation level.
func (e *env) consumeAt(topic string, level sarama.IsolationLevel) *records {
	e.t.Helper()
	cfg := e.k.SaramaConfig()
	cfg.Consumer.IsolationLevel = level
	c, err := sarama.NewConsumer(e.k.Brokers, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	parts, err := c.Partitions(topic)
	if err != nil {
		e.t.Fatal(err)
	}
	r := &records{}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		var pc sarama.PartitionConsumer
		idemtest.Eventually(e.t, 30*time.Second, func() (err error) {
			pc, err = c.ConsumePartition(topic, p, sarama.OffsetOldest)
			return err
		})
		pcs = append(pcs, pc)
		wg.Go(func() {
			for m := range pc.Messages() {
				r.mu.Lock()
				r.list = append(r.list, m)
				r.arrived = append(r.arrived, time.Now())
				r.mu.Unlock()
			}
		})
	}
	e.t.Cleanup(func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		_ = c.Close()
	})
	return r
}

func (r *records) snapshot() []*sarama.ConsumerMessage {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.list)
}

// values returns the values of the records with key, in arrival order.
func (r *records) values(key string) []string {
	var out []string
	for _, m := range r.snapshot() {
		if string(m.Key) == key {
			out = append(out, string(m.Value))
		}
	}
	return out
}

// waitKeys waits until every key has at least one record.
func (r *records) waitKeys(t *testing.T, keys ...string) {
	t.Helper()
	idemtest.Eventually(t, 60*time.Second, func() error {
		for _, k := range keys {
			if len(r.values(k)) == 0 {
				return fmt.Errorf("no record with key %q yet (%d records)", k, len(r.snapshot()))
			}
		}
		return nil
	})
}

func header(m *sarama.ConsumerMessage, name string) string {
	for _, h := range m.Headers {
		if string(h.Key) == name {
			return string(h.Value)
		}
	}
	return ""
}

// metric returns testenv.Metric of name with the given label values, in
// label-name order: table; reason, table; or group, outcome, topic.
func metric(t testing.TB, reg *prometheus.Registry, name string, values ...string) float64 {
	t.Helper()
	names := map[int][]string{1: {"table"}, 2: {"reason", "table"}, 3: {"group", "outcome", "topic"}}[len(values)]
	want := map[string]string{}
	for i, v := range values {
		want[names[i]] = v
	}
	return testenv.Metric(t, reg, name, want)
}

// waitMetric waits until metric name (labels in label-name order) is want.
func waitMetric(t *testing.T, reg *prometheus.Registry, want float64, name string, labels ...string) {
	t.Helper()
	idemtest.Eventually(t, 30*time.Second, func() error {
		if got := metric(t, reg, name, labels...); got != want {
			return fmt.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
		return nil
	})
}

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("IDEM_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: level}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// startChild starts this test binary as a child process that runs only
// test, with env added and schemaEnv set to the test's schema.
func (e *env) startChild(test, schemaEnv string, env ...string) *testenv.Child {
	e.t.Helper()
	return testenv.StartChild(e.t, test, append([]string{schemaEnv + "=" + e.schema,
		"KAFKA_BROKERS=" + strings.Join(e.k.Brokers, ",")}, env...)...)
}

// childEnvOf returns, in a child process started by startChild, the env on
// the schema named by schemaEnv; nil in a normal run.
func childEnvOf(t *testing.T, schemaEnv string) *env {
	schema := os.Getenv(schemaEnv)
	if schema == "" {
		return nil
	}
	return &env{t: t, k: idemtest.Connect(t), pool: testenv.PoolOnSchema(t, schema), schema: schema}
}

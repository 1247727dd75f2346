package schedule_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/schedule"
)

// env is one test's broker, database schema (with idem_deferred), topic
// and group.
type env struct {
	t      testing.TB
	k      *idemtest.Kafka
	pool   *pgxpool.Pool
	schema string
	topic  string
	group  string
}

func newEnv(t testing.TB, partitions int32) *env {
	t.Helper()
	k := idemtest.Connect(t)
	db := idemtest.ConnectPostgres(t)
	if err := schedule.Migrate(t.Context(), db.Pool); err != nil { // idempotent: idem_deferred is there already
		t.Fatal(err)
	}
	return &env{t: t, k: k, pool: db.Pool, schema: db.Schema, topic: k.Topic(t, "t", partitions), group: k.Group(t, "g")}
}

// scheduler returns a scheduler of the test's group tuned for quick tests,
// with a registry of its own.
func (e *env) scheduler() (*schedule.Scheduler, *prometheus.Registry) {
	reg := prometheus.NewRegistry()
	return &schedule.Scheduler{
		Pool:          e.pool,
		Brokers:       e.k.Brokers,
		Sarama:        e.k.SaramaConfig(),
		Group:         e.group,
		LeaderRetry:   100 * time.Millisecond,
		RetryBase:     10 * time.Millisecond,
		RetryMax:      200 * time.Millisecond,
		StatsInterval: 50 * time.Millisecond,
		Logger:        testLogger(e.t),
		Registerer:    reg,
	}, reg
}

// run runs s until the test ends and checks it returned nil.
func run(t testing.TB, s *schedule.Scheduler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Scheduler.Run: %v", err)
		}
	})
}

// record is the i-th test record: key k<i>, its own idempotency key, read
// from offset i of partition i%3 of "payments", as a consumer would store it.
func (e *env) record(i int) schedule.Record {
	key := fmt.Sprintf("k%03d", i)
	return schedule.RecordOf(e.group, e.topic, &handler.Message{
		Topic: "payments", Partition: int32(i % 3), Offset: int64(i), Timestamp: time.UnixMilli(1_700_000_000_000),
		Key: []byte(key), Value: []byte("v-" + key), IdempotencyKey: "idem-" + key, Attempt: 1,
		Headers: []handler.Header{{Key: "idempotency-key", Value: []byte("idem-" + key)}},
	})
}

// deferAll inserts recs due at in one committed transaction.
func (e *env) deferAll(at time.Time, recs ...schedule.Record) {
	e.t.Helper()
	ctx := e.t.Context()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, r := range recs {
		if err := schedule.Defer(ctx, tx, r, at, nil); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatal(err)
	}
}

// dbNow returns the database's clock.
func (e *env) dbNow() time.Time {
	e.t.Helper()
	var now time.Time
	if err := e.pool.QueryRow(e.t.Context(), "SELECT clock_timestamp()").Scan(&now); err != nil {
		e.t.Fatal(err)
	}
	return now
}

func (e *env) pending() int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.t.Context(), "SELECT count(*) FROM idem_deferred").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// arrival is one record read back, with the database's clock when read.
type arrival struct {
	m    *sarama.ConsumerMessage
	dbAt time.Time
}

// collector reads every partition of a topic from the oldest offset until
// the test ends.
type collector struct {
	mu   sync.Mutex
	list []arrival
}

func (e *env) collect() *collector {
	e.t.Helper()
	c, err := sarama.NewConsumer(e.k.Brokers, e.k.SaramaConfig())
	if err != nil {
		e.t.Fatal(err)
	}
	parts, err := c.Partitions(e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	col := &collector{}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		pc, err := c.ConsumePartition(e.topic, p, sarama.OffsetOldest)
		if err != nil {
			e.t.Fatal(err)
		}
		pcs = append(pcs, pc)
		wg.Go(func() {
			for m := range pc.Messages() {
				var now time.Time
				_ = e.pool.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&now)
				col.mu.Lock()
				col.list = append(col.list, arrival{m, now})
				col.mu.Unlock()
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
	return col
}

func (c *collector) snapshot() []arrival {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]arrival(nil), c.list...)
}

// byKey groups the records read so far by Kafka key.
func (c *collector) byKey() map[string][]arrival {
	out := map[string][]arrival{}
	for _, a := range c.snapshot() {
		out[string(a.m.Key)] = append(out[string(a.m.Key)], a)
	}
	return out
}

// waitKeys waits until n distinct keys were read.
func (c *collector) waitKeys(t testing.TB, n int) {
	t.Helper()
	idemtest.Eventually(t, 90*time.Second, func() error {
		if got := len(c.byKey()); got != n {
			return fmt.Errorf("%d of %d keys read", got, n)
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

// startChild runs this test binary as a child running only test, with the
// test's schema, group and topic in its environment.
func (e *env) startChild(test string) *testenv.Child {
	e.t.Helper()
	return testenv.StartChild(e.t, test, childEnv+"="+strings.Join([]string{e.schema, e.group, e.topic}, ","),
		"KAFKA_BROKERS="+strings.Join(e.k.Brokers, ","))
}

// childEnvOf returns, in a child started by startChild, its env; nil in a
// normal run.
func childEnvOf(t *testing.T) *env {
	v := os.Getenv(childEnv)
	if v == "" {
		return nil
	}
	p := strings.Split(v, ",")
	return &env{t: t, k: idemtest.Connect(t), pool: testenv.PoolOnSchema(t, p[0]), schema: p[0], group: p[1], topic: p[2]}
}

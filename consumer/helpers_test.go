package consumer_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/schedule"
)

// env is one test's broker, database and names.
type env struct {
	t     *testing.T
	k     *testenv.Kafka
	pool  *pgxpool.Pool
	query *pgxpool.Pool // the test's own reads: never starved by the consumer's lanes holding e.pool
	topic string
	group string
	reg   *prometheus.Registry
	mode  testMode // the pipeline mode config() applies; see forEachMode
}

func newEnv(t *testing.T, partitions int32) *env {
	t.Helper()
	k := testenv.NewKafka(t)
	pool, schema := testenv.PostgresSchema(t)
	e := &env{t: t, k: k, pool: pool, query: testenv.PoolOnSchema(t, schema), topic: k.Topic(t, partitions), group: testenv.Group(t), reg: prometheus.NewRegistry()}
	ctx := testenv.Context(t)
	if err := dedupe.NewPostgres(e.pool).Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A business table WITHOUT a unique constraint: only the inbox prevents doubles.
	if _, err := e.pool.Exec(ctx, `CREATE TABLE effects(key text not null, topic text, part int, off bigint, at timestamptz default now())`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// idem's own topics for this test's group.
		var names []string
		for _, suffix := range []string{".dlq", ".retry.1", ".retry.2", ".retry.3"} {
			names = append(names, e.topic+"."+e.group+suffix)
		}
		k.DeleteTopics(t, names...)
	})
	return e
}

func (e *env) config() consumer.Config {
	level := slog.LevelWarn
	if os.Getenv("IDEM_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	cfg := consumer.Config{
		Brokers:        e.k.Brokers,
		Group:          e.group,
		Topics:         []string{e.topic},
		Dedupe:         dedupe.NewPostgres(e.pool),
		Sarama:         e.k.SaramaConfig(),
		Logger:         slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: level})),
		Registerer:     e.reg,
		CommitInterval: 100 * time.Millisecond,
		ShutdownGrace:  5 * time.Second,
		Retry:          consumer.RetryConfig{Backoff: recovery.Backoff{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}},
	}
	return e.mode.apply(cfg)
}

// in sets the pipeline mode e.config() applies and returns e.
func (e *env) in(mode testMode) *env {
	e.mode = mode
	return e
}

// testMode is one of the pipeline's modes: "" (per message: one lane, one
// transaction per message), "batch" (batched transactions), "lanes" (16
// lanes per partition) and "lanes-batch" (4 lanes, each batching); "txn"
// and "txn-lanes" are "" and "lanes" with Config.Transactions.
type testMode string

// allModes are the modes the core tests run in; orderingModes the ones the
// ordering tests run in (Ordering takes no Batch), with and without
// Transactions.
var (
	allModes      = []testMode{"", "batch", "lanes", "lanes-batch"}
	orderingModes = []testMode{"", "lanes", "txn", "txn-lanes"}
)

// name is the mode's subtest name.
func (m testMode) name() string {
	if m == "" {
		return "per-message"
	}
	return string(m)
}

// forEachMode runs fn as one parallel subtest per mode (named per-message,
// batch, lanes, lanes-batch), in the style of pgx's test helpers that run a
// test body once per query exec mode: one `go test` checks every mode.
func forEachMode(t *testing.T, modes []testMode, fn func(t *testing.T, mode testMode)) {
	t.Helper()
	for _, mode := range modes {
		t.Run(mode.name(), func(t *testing.T) {
			t.Parallel()
			fn(t, mode)
		})
	}
}

// apply returns cfg in mode m.
func (m testMode) apply(cfg consumer.Config) consumer.Config {
	switch m {
	case "":
	case "batch":
		cfg.Batch = consumer.BatchConfig{MaxMessages: 50}
	case "lanes":
		cfg.Concurrency = 16
	case "lanes-batch":
		cfg.Concurrency = 4
		cfg.Batch = consumer.BatchConfig{MaxMessages: 16}
	case "txn":
		cfg.Transactions.Enabled = true
	case "txn-lanes":
		cfg.Transactions.Enabled = true
		cfg.Concurrency = 16
	default:
		panic("unknown test mode " + string(m))
	}
	return cfg
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// produce sends one record per key to partition i%partitions with the
// idempotency-key header, and returns how many it sent.
func (e *env) produce(keys []string, partitions int) {
	e.t.Helper()
	p := e.k.Producer(e.t)
	msgs := make([]*sarama.ProducerMessage, 0, len(keys))
	for i, k := range keys {
		msgs = append(msgs, &sarama.ProducerMessage{
			Topic: e.topic, Partition: int32(i % partitions),
			Key:     sarama.StringEncoder(k),
			Value:   sarama.StringEncoder(fmt.Sprintf(`{"n":%d}`, i)),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(k)}},
		})
	}
	for len(msgs) > 0 {
		n := min(len(msgs), 500)
		if err := p.SendMessages(msgs[:n]); err != nil {
			e.t.Fatalf("produce: %v", err)
		}
		msgs = msgs[n:]
	}
}

// releaseDeferred makes every deferral of the test's group stored in
// idem_deferred due now. Tests defer by an hour and release with this, so
// that a deferral ends when the test says, not when a few seconds have
// passed on a machine of unknown speed; deferScheduler's leader sees the
// change within its MaxWait.
func (e *env) releaseDeferred() {
	e.t.Helper()
	if _, err := e.query.Exec(context.Background(), `UPDATE idem_deferred SET due_at = now() WHERE consumer_group = $1`, e.group); err != nil {
		e.t.Fatalf("release deferred: %v", err)
	}
}

// deferScheduler is Config.Defer for tests that release their deferrals
// with releaseDeferred: an idle leader looks at the table every 100 ms.
func (e *env) deferScheduler() *schedule.Scheduler {
	return &schedule.Scheduler{Pool: e.pool, MaxWait: 100 * time.Millisecond}
}

// effectHandler writes one effects row per handled message through the
// message's transaction.
func effectHandler() handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO effects(key, topic, part, off) VALUES ($1,$2,$3,$4)`,
			m.IdempotencyKey, m.Topic, m.Partition, m.Offset)
		return err
	}
}

// running is a Run call in the background.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// start runs consumer.Run until stop (or the test's end).
func start(t *testing.T, cfg consumer.Config, h handler.Handler) *running {
	t.Helper()
	return startCtx(t, context.Background(), cfg, h)
}

// startCtx is start with a context of the test's choosing (order hooks ride
// on it).
func startCtx(t *testing.T, ctx context.Context, cfg consumer.Config, h handler.Handler) *running {
	t.Helper()
	return startFunc(t, ctx, func(ctx context.Context) error { return consumer.Run(ctx, cfg, h) })
}

// startFunc runs run in the background until stop (or the test's end), and
// reports an error it returns other than cancellation.
func startFunc(t *testing.T, ctx context.Context, run func(context.Context) error) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- run(ctx) }()
	t.Cleanup(func() {
		if err := r.stop(); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// stop cancels Run and waits for it to return.
func (r *running) stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.done
	})
	return r.err
}

func (e *env) count(q string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.query.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// committed returns the group's committed offsets per partition of topic.
func (e *env) committed(topic string, partitions int32) map[int32]int64 {
	e.t.Helper()
	a := e.k.Admin(e.t)
	ps := make([]int32, partitions)
	for i := range ps {
		ps[i] = int32(i)
	}
	resp, err := a.ListConsumerGroupOffsets(e.group, map[string][]int32{topic: ps})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[int32]int64{}
	for p, b := range resp.Blocks[topic] {
		out[p] = b.Offset
	}
	return out
}

// endOffsets returns the high-water marks of topic.
func (e *env) endOffsets(topic string, partitions int32) map[int32]int64 {
	e.t.Helper()
	c, err := sarama.NewClient(e.k.Brokers, e.k.SaramaConfig())
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	out := map[int32]int64{}
	for p := range partitions {
		// A topic just made (by the test, or by Run for a dead-letter
		// topic) may not have reached this client's metadata, or its
		// leader may still move on a loaded broker: those errors are
		// retried with fresh metadata, anything else fails.
		testenv.Eventually(e.t, 60*time.Second, func() error {
			o, err := c.GetOffset(topic, p, sarama.OffsetNewest)
			if errors.Is(err, sarama.ErrNotLeaderForPartition) || errors.Is(err, sarama.ErrUnknownTopicOrPartition) ||
				errors.Is(err, sarama.ErrLeaderNotAvailable) || errors.Is(err, sarama.ErrNotCoordinatorForConsumer) {
				_ = c.RefreshMetadata(topic)
				return err
			}
			if err != nil {
				e.t.Fatal(err)
			}
			out[p] = o
			return nil
		})
	}
	return out
}

// waitCommitted waits until every partition's committed offset reaches its end.
func (e *env) waitCommitted(topic string, partitions int32, timeout time.Duration) {
	e.t.Helper()
	want := e.endOffsets(topic, partitions)
	testenv.Eventually(e.t, timeout, func() error {
		got := e.committed(topic, partitions)
		for p, w := range want {
			if w == 0 && got[p] < 0 {
				continue // an empty partition has nothing to commit
			}
			if got[p] != w {
				return fmt.Errorf("partition %d committed %d, end %d", p, got[p], w)
			}
		}
		return nil
	})
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// metricValue sums the samples of the metric family name in e's registry whose
// labels include want.
func metricValue(t *testing.T, e *env, name string, want map[string]string) float64 {
	t.Helper()
	return gatherSum(t, e.reg, name, want)
}

// gatherSum sums the samples (counter and gauge values, histogram counts) of
// the metric family name whose labels include want; 0 if there is none.
func gatherSum(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	return testenv.Metric(t, g, name, want)
}

// bigProducer returns a sync producer (manual partitioner) that sends
// records of up to 8 MiB, closed when the test ends.
func (e *env) bigProducer() sarama.SyncProducer {
	e.t.Helper()
	cfg := e.k.SaramaConfig()
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.MaxMessageBytes = 8 << 20
	p, err := sarama.NewSyncProducer(e.k.Brokers, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = p.Close() })
	return p
}

// logBuffer collects log output for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

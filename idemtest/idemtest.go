package idemtest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	idemschema "github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testkit"
	"github.com/idemhq/idem/recovery"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/committed"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// defaultTimeout is how long the Wait and Read helpers, and ConnectPostgres's
// migration, wait before they fail the test: 30 s.
const defaultTimeout = 30 * time.Second

// Kafka is the cluster a test runs on. From NewKafka (and from Connect
// without KAFKA_BROKERS) it is an in-process cluster of one broker
// (franz-go's kfake): no Docker, no ports to configure, gone when the test
// ends. It speaks the Kafka protocol, so consumer.Run, sarama and the idem
// CLI's library talk to it as to a real broker; it is made for tests, not
// for load or for checking broker-specific behaviour. From Connect with
// KAFKA_BROKERS it is that real cluster, which outlives the test.
type Kafka struct {
	// Brokers are the bootstrap addresses of the cluster ("127.0.0.1:port").
	Brokers []string
}

// NewKafka starts a cluster for tb and shuts it down when tb ends. Each call
// starts a cluster of its own, so parallel tests never share state.
func NewKafka(tb testing.TB) *Kafka {
	tb.Helper()
	return &Kafka{Brokers: testkit.InProcess(tb)}
}

// SaramaConfig returns a sarama config suited to the cluster: protocol
// version idem gives sarama (4.0), a synchronous producer's successes
// returned, acks from all replicas.
func (k *Kafka) SaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = wire.KafkaVersion
	c.Producer.Return.Successes = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Producer.Partitioner = sarama.NewManualPartitioner
	return c
}

// CreateTopic creates a topic with the given number of partitions and waits
// until every partition's leader answers (a produce or fetch right after
// creation is otherwise refused for a moment with NOT_LEADER_OR_FOLLOWER).
// The name is used as given, and an existing topic of that name fails the
// test: on a broker shared between tests and runs (Connect with
// KAFKA_BROKERS) use Topic, whose names are unique and cleaned up.
func (k *Kafka) CreateTopic(tb testing.TB, name string, partitions int32) {
	tb.Helper()
	k.kit().CreateTopic(tb, name, partitions, false)
}

// Record is a record to produce.
type Record struct {
	// Partition is the partition to write to.
	// Default: 0.
	Partition int32
	// IdempotencyKey, when not empty, is written as the "idempotency-key"
	// header, the consumer's default KeyFunc.
	IdempotencyKey string
	// Key and Value are the record's key and value; nil is a null key or
	// value.
	Key, Value []byte
	// Headers are extra headers, written after idempotency-key.
	Headers []handler.Header
}

// Produce writes recs to topic, in order, and fails the test when the
// broker does not acknowledge them all. The producer is idempotent, so each
// record is written once even when a send is retried (a connection that
// broke after the request went out), and a test can count what it produced.
func (k *Kafka) Produce(tb testing.TB, topic string, recs ...Record) {
	tb.Helper()
	cfg := k.SaramaConfig()
	testkit.ProducerConfig(cfg) // with RequiredAcks = WaitForAll (SaramaConfig)
	p, err := sarama.NewSyncProducer(k.Brokers, cfg)
	if err != nil {
		tb.Fatalf("idemtest: producer: %v", err)
	}
	defer p.Close()
	msgs := make([]*sarama.ProducerMessage, len(recs))
	for i, r := range recs {
		m := &sarama.ProducerMessage{Topic: topic, Partition: r.Partition}
		if r.Key != nil {
			m.Key = sarama.ByteEncoder(r.Key)
		}
		if r.Value != nil {
			m.Value = sarama.ByteEncoder(r.Value)
		}
		if r.IdempotencyKey != "" {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte("idempotency-key"), Value: []byte(r.IdempotencyKey)})
		}
		for _, h := range r.Headers {
			m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		msgs[i] = m
	}
	if err := p.SendMessages(msgs); err != nil {
		tb.Fatalf("idemtest: produce to %s: %v", topic, err)
	}
}

// Config returns a consumer.Config for group reading topics from the
// cluster, tuned for tests: a dedupe.NewMemory store (use WithPostgres for
// the transactional inbox), logs through tb.Log at WARN, offsets committed
// every 100ms, in-process retries backing off 1–10ms, a 5s ShutdownGrace,
// and no DLQ depth polling. Every field can be changed before Start.
func (k *Kafka) Config(tb testing.TB, group string, topics ...string) consumer.Config {
	return consumer.Config{
		Brokers:          k.Brokers,
		Group:            group,
		Topics:           topics,
		Dedupe:           dedupe.NewMemory(),
		Sarama:           k.SaramaConfig(),
		Logger:           slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		CommitInterval:   100 * time.Millisecond,
		Retry:            consumer.RetryConfig{Backoff: recovery.Backoff{Base: time.Millisecond, Max: 10 * time.Millisecond}},
		ShutdownGrace:    5 * time.Second,
		DLQDepthInterval: -1,
	}
}

// WithPostgres returns cfg using the transactional inbox over db
// (dedupe.NewPostgres), after creating idem's tables as idem.Migrate does.
// db is usually a *pgxpool.Pool on a test database; handlers then write
// through dedupe.Tx(ctx) exactly as in production. Without it, the kit's
// memory store runs handlers with no transaction: every call on
// dedupe.Tx(ctx) fails with a permanent error that names the store to
// configure (so the message is dead-lettered with that reason).
func WithPostgres(tb testing.TB, cfg consumer.Config, db dedupe.DB) consumer.Config {
	tb.Helper()
	if err := idemschema.Migrate(context.Background(), db, nil, nil); err != nil {
		tb.Fatalf("idemtest: migrate: %v", err)
	}
	cfg.Dedupe = dedupe.NewPostgres(db)
	return cfg
}

// tbWriter writes log lines to the test's log, until the test ends.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Consumer is a consumer.Run started by Start.
type Consumer struct {
	group   string
	gather  prometheus.Gatherer
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once
	err     error
}

// Start runs consumer.Run(cfg, h) in the background (h may be a batch
// handler, handler.Batch(fn)) until Stop is called or the test ends, and
// fails the test if Run returns an error other than at Stop. When
// cfg.Registerer is nil Start gives it a fresh Prometheus registry, which the
// Wait methods read; a Registerer of your own must also be a
// prometheus.Gatherer (a *prometheus.Registry is).
func Start(tb testing.TB, cfg consumer.Config, h handler.Handler) *Consumer {
	tb.Helper()
	return start(tb, &cfg, func(ctx context.Context) error { return consumer.Run(ctx, cfg, h) })
}

func start(tb testing.TB, cfg *consumer.Config, run func(context.Context) error) *Consumer {
	tb.Helper()
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	g, ok := cfg.Registerer.(prometheus.Gatherer)
	if !ok {
		tb.Fatalf("idemtest: Config.Registerer is a %T, which is not a prometheus.Gatherer: leave it nil or pass a *prometheus.Registry", cfg.Registerer)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Consumer{group: cfg.Group, gather: g, cancel: cancel, done: make(chan error, 1)}
	go func() { c.done <- run(ctx) }()
	tb.Cleanup(func() {
		if err := c.Stop(); err != nil {
			tb.Errorf("idemtest: consumer.Run: %v", err)
		}
	})
	return c
}

// Stop cancels Run, waits until it has returned (every in-flight message
// finished or rolled back, offsets committed) and returns its error. It may
// be called more than once; the test's end calls it too.
func (c *Consumer) Stop() error {
	c.stopped.Do(func() {
		c.cancel()
		c.err = <-c.done
	})
	return c.err
}

// Outcomes returns how many records the group has taken to each final
// outcome so far ("processed", "duplicate", "retried" (forwarded to a retry
// tier), "dead_lettered", "parked"), from idem_messages_total. A record read
// back from a retry tier is counted again with its own outcome.
func (c *Consumer) Outcomes(tb testing.TB) map[string]int {
	tb.Helper()
	mfs, err := c.gather.Gather()
	if err != nil {
		tb.Fatalf("idemtest: gather metrics: %v", err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "idem_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var group, outcome string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "group":
					group = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			if group == c.group {
				out[outcome] += int(m.GetCounter().GetValue())
			}
		}
	}
	return out
}

// WaitHandled waits until the group has taken at least n records to a final
// outcome (see Outcomes: every outcome counts, and a record read back from a
// retry tier counts again), and fails the test after 30 s.
func (c *Consumer) WaitHandled(tb testing.TB, n int) {
	tb.Helper()
	Eventually(tb, defaultTimeout, func() error {
		total := 0
		outs := c.Outcomes(tb)
		for _, v := range outs {
			total += v
		}
		if total < n {
			return fmt.Errorf("%d of %d records handled (%v)", total, n, outs)
		}
		return nil
	})
}

// WaitOutcome waits until at least n records have reached outcome (a label
// value of idem_messages_total, such as "processed" or "dead_lettered"), and
// fails the test after 30 s.
func (c *Consumer) WaitOutcome(tb testing.TB, outcome string, n int) {
	tb.Helper()
	Eventually(tb, defaultTimeout, func() error {
		if got := c.Outcomes(tb)[outcome]; got < n {
			return fmt.Errorf("%d of %d records %s", got, n, outcome)
		}
		return nil
	})
}

// DeadLetter is one record of a dead-letter topic, with its idem-* headers
// decoded.
type DeadLetter struct {
	// Partition and Offset locate it in the dead-letter topic.
	Partition int32
	Offset    int64
	// Key and Value are the original record's bytes, unchanged.
	Key, Value []byte
	// Headers are the original record's headers without the wire
	// contract's idem-* headers (DESIGN.md lists them): other names, such
	// as outbox.Relay's idem-outbox-id, are kept.
	Headers []handler.Header
	// Failure is what the idem-* headers say: error, kind, attempts, and the
	// original topic, partition and offset.
	Failure retrytopic.Failure
}

// ReadDLQ waits until the dead-letter topic dlqTopic holds at least n
// records (failing the test after 30 s) and returns all of them, partition
// by partition in offset order. It reads as a read_committed consumer does:
// a dead-letter topic written with transactions (consumer.Config's
// Transactions) holds a marker after each transaction and may hold the
// records of aborted ones; neither is a dead letter, so neither is counted
// or returned. The default dead-letter topic of topic for group is
// retrytopic.Policy{}.DLQ(topic, group), "<topic>.<group>.dlq".
func (k *Kafka) ReadDLQ(tb testing.TB, dlqTopic string, n int) []DeadLetter {
	tb.Helper()
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		tb.Fatalf("idemtest: client: %v", err)
	}
	defer client.Close()
	var out []DeadLetter
	Eventually(tb, defaultTimeout, func() error {
		if err := client.RefreshMetadata(dlqTopic); err != nil {
			return err
		}
		ps, err := client.Partitions(dlqTopic)
		if err != nil {
			return err
		}
		ps = slices.Sorted(slices.Values(ps))
		out = out[:0]
		for _, p := range ps {
			start, err := client.GetOffset(dlqTopic, p, sarama.OffsetOldest)
			if err != nil {
				return err
			}
			end, err := committed.End(client, dlqTopic, p)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
			err = committed.Read(ctx, client, dlqTopic, p, start, end, 5*time.Second, func(m *sarama.ConsumerMessage) error {
				out = append(out, deadLetter(m))
				return nil
			})
			cancel()
			if err != nil {
				return err
			}
		}
		if len(out) < n {
			return fmt.Errorf("dead-letter topic %s has %d of %d records", dlqTopic, len(out), n)
		}
		return nil
	})
	return out
}

func deadLetter(m *sarama.ConsumerMessage) DeadLetter {
	d := DeadLetter{Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value}
	d.Failure, _, _ = wire.Decode(m.Headers)
	for _, h := range wire.StripHeaders(m.Headers) { // keeps idem-outbox-id: only the wire contract's headers go
		d.Headers = append(d.Headers, handler.Header{Key: string(h.Key), Value: h.Value})
	}
	return d
}

// Eventually calls f until it returns nil, waiting a little longer each
// time, and fails the test with f's last error once timeout has passed. Use
// it to wait for an effect instead of sleeping.
func Eventually(tb testing.TB, timeout time.Duration, f func() error) {
	tb.Helper()
	testkit.Eventually(tb, timeout, f)
}

// Package failidxtest is the test helpers of the failure index, shared by
// the tests of internal/failidx (the store and the actions) and of
// console/index (the indexer): dead letters to seed as the consumer writes
// them, a database with the index's tables, and readers of Kafka topics and
// of the index's tables.
//
// It imports neither failidx nor console/index, whose in-package tests
// import it, nor idemtest, which imports console/index through consumer: it
// is built on internal/testing/testenv.
package failidxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/committed"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// NewPool returns a pool on a schema of its own with the index's tables
// (and no other idem table), and the schema's name.
func NewPool(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema := testenv.PostgresSchema(tb)
	if err := tables.MigrateIndex(testenv.Context(tb), pool); err != nil {
		tb.Fatal(err)
	}
	return pool, schema
}

// Dead is one dead letter to seed.
type Dead struct {
	Topic      string // DLQ topic
	Partition  int32
	Origin     string
	Group      string // default "billing"
	Key        string // Kafka key and idempotency-key header
	Derived    string // idem-idempotency-key header, when set
	Value      []byte
	Kind       handler.Kind // default permanent
	Err        string
	Stub       bool
	LastFailed time.Time // default now
	ReplayOf   string    // idem-replay-of header, when set
}

// Headers returns the record's headers as the consumer writes them.
func (d Dead) Headers() []sarama.RecordHeader {
	group := d.Group
	if group == "" {
		group = "billing"
	}
	kind := d.Kind
	if kind == "" {
		kind = handler.KindPermanent
	}
	last := d.LastFailed
	if last.IsZero() {
		last = time.Now()
	}
	f := retrytopic.Failure{Attempt: 3, OriginalTopic: d.Origin, OriginalPartition: d.Partition, Group: group, Kind: kind,
		ErrorType: "*errors.errorString", Error: d.Err, FirstFailureAt: last.Add(-time.Minute), LastFailureAt: last}
	if d.Stub {
		f.Stub, f.OmittedBytes = true, 3<<20
		f.ForwardError = "kafka server: Message was too large"
	}
	orig := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(d.Key)}, {Key: []byte("trace"), Value: []byte("t-1")}}
	hs := wire.Encode(orig, f)
	if d.Derived != "" {
		hs = append(hs, sarama.RecordHeader{Key: []byte(wire.HeaderIdempotencyKey), Value: []byte(d.Derived)})
	}
	if d.ReplayOf != "" {
		hs = append(hs, sarama.RecordHeader{Key: []byte(wire.HeaderReplayOf), Value: []byte(d.ReplayOf)})
	}
	return hs
}

// Messages returns ds as consumed records at offsets from first on (a stub
// without its value), for a test that stores them without Kafka.
func Messages(first int64, ds ...Dead) []*sarama.ConsumerMessage {
	out := make([]*sarama.ConsumerMessage, 0, len(ds))
	for i, d := range ds {
		m := &sarama.ConsumerMessage{Topic: d.Topic, Partition: d.Partition, Offset: first + int64(i), Key: []byte(d.Key), Timestamp: time.Now()}
		if !d.Stub {
			m.Value = d.Value
		}
		for _, h := range d.Headers() {
			m.Headers = append(m.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		out = append(out, m)
	}
	return out
}

// Produce writes ds to Kafka, each to its topic and partition (a stub
// without its value).
func Produce(tb testing.TB, k *testenv.Kafka, ds ...Dead) {
	tb.Helper()
	msgs := make([]*sarama.ProducerMessage, 0, len(ds))
	for _, d := range ds {
		m := &sarama.ProducerMessage{Topic: d.Topic, Partition: d.Partition, Key: sarama.StringEncoder(d.Key), Headers: d.Headers()}
		if d.Value != nil && !d.Stub {
			m.Value = sarama.ByteEncoder(d.Value)
		}
		msgs = append(msgs, m)
	}
	if err := k.Producer(tb).SendMessages(msgs); err != nil {
		tb.Fatal(err)
	}
}

// Count returns the integer an SQL query returns.
func Count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatal(err)
	}
	return n
}

// WaitCount waits (up to a minute) until sql returns want.
func WaitCount(tb testing.TB, pool *pgxpool.Pool, want int64, sql string, args ...any) {
	tb.Helper()
	testenv.Eventually(tb, 60*time.Second, func() error {
		if n := Count(tb, pool, sql, args...); n != want {
			return fmt.Errorf("%s = %d, want %d", sql, n, want)
		}
		return nil
	})
}

// Client returns a Kafka client on k with config cfg, closed when the test
// ends.
func Client(tb testing.TB, k *testenv.Kafka, cfg *sarama.Config) sarama.Client {
	tb.Helper()
	c, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// ReadAll returns every record of topic's partitions, by partition then
// offset, as a read_committed consumer reads them (committed.Read).
func ReadAll(tb testing.TB, k *testenv.Kafka, topic string) []*sarama.ConsumerMessage {
	tb.Helper()
	var out []*sarama.ConsumerMessage
	eachPartition(tb, k, topic, func(client sarama.Client, p int32) {
		oldest, err1 := client.GetOffset(topic, p, sarama.OffsetOldest)
		end, err2 := committed.End(client, topic, p)
		if err := errors.Join(err1, err2); err != nil {
			tb.Fatal(err)
		}
		err := committed.Read(context.Background(), client, topic, p, oldest, end, 30*time.Second, func(m *sarama.ConsumerMessage) error {
			out = append(out, m)
			return nil
		})
		if err != nil {
			tb.Fatalf("read %s/%d: %v", topic, p, err)
		}
	})
	return out
}

// eachPartition calls f for each partition of topic, in order, with a
// client of its own.
func eachPartition(tb testing.TB, k *testenv.Kafka, topic string, f func(sarama.Client, int32)) {
	tb.Helper()
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		tb.Fatal(err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		tb.Fatal(err)
	}
	for _, p := range slices.Sorted(slices.Values(parts)) {
		f(client, p)
	}
}

// Header returns the value of m's first header named key.
func Header(m *sarama.ConsumerMessage, key string) (string, bool) {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// Gauge returns the value of gauge name{group,topic} (name{topic} when group
// is "") gathered from g; the test fails when there is no such series.
func Gauge(tb testing.TB, g prometheus.Gatherer, name, group, topic string) float64 {
	tb.Helper()
	labels := map[string]string{"topic": topic}
	if group != "" {
		labels["group"] = group
	}
	v, ok := testenv.MetricFound(tb, g, name, labels)
	if !ok {
		tb.Fatalf("no %s%v", name, labels)
	}
	return v
}

// EndOffsets returns the sum of topic's partitions' end offsets: how many
// offsets producers have used (records, and markers of transactions).
func EndOffsets(tb testing.TB, k *testenv.Kafka, topic string) int64 {
	tb.Helper()
	var sum int64
	eachPartition(tb, k, topic, func(client sarama.Client, p int32) {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			tb.Fatal(err)
		}
		sum += end
	})
	return sum
}

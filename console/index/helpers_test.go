package index

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/indextable"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// newPool returns a pool on a fresh schema with the index's tables.
func newPool(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool, schema := testenv.PostgresSchema(t)
	if err := indextable.Migrate(testenv.Context(t), pool); err != nil {
		t.Fatal(err)
	}
	return pool, schema
}

// dead is one dead letter to seed.
type dead struct {
	topic      string // DLQ topic
	partition  int32
	origin     string
	group      string
	key        string // Kafka key and idempotency-key header
	derived    string // idem-idempotency-key header, when set
	value      []byte
	kind       handler.Kind
	err        string
	stub       bool
	lastFailed time.Time
	replayOf   string // idem-replay-of header, when set
}

// headers returns the record's headers as the consumer writes them.
func (d dead) headers() []sarama.RecordHeader {
	group := d.group
	if group == "" {
		group = "billing"
	}
	kind := d.kind
	if kind == "" {
		kind = handler.KindPermanent
	}
	last := d.lastFailed
	if last.IsZero() {
		last = time.Now()
	}
	f := retrytopic.Failure{Attempt: 3, OriginalTopic: d.origin, OriginalPartition: d.partition, Group: group, Kind: kind,
		ErrorType: "*errors.errorString", Error: d.err, FirstFailureAt: last.Add(-time.Minute), LastFailureAt: last}
	if d.stub {
		f.Stub, f.OmittedBytes = true, 3<<20
		f.ForwardError = "kafka server: Message was too large"
	}
	orig := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(d.key)}, {Key: []byte("trace"), Value: []byte("t-1")}}
	hs := wire.Encode(orig, f)
	if d.derived != "" {
		hs = append(hs, sarama.RecordHeader{Key: []byte("idem-idempotency-key"), Value: []byte(d.derived)})
	}
	if d.replayOf != "" {
		hs = append(hs, sarama.RecordHeader{Key: []byte("idem-replay-of"), Value: []byte(d.replayOf)})
	}
	return hs
}

// produce writes ds to Kafka (each to its topic and partition).
func produce(t *testing.T, k *testenv.Kafka, ds ...dead) {
	t.Helper()
	p := k.Producer(t)
	msgs := make([]*sarama.ProducerMessage, 0, len(ds))
	for _, d := range ds {
		m := &sarama.ProducerMessage{Topic: d.topic, Partition: d.partition, Key: sarama.StringEncoder(d.key), Headers: d.headers()}
		if d.value != nil && !d.stub {
			m.Value = sarama.ByteEncoder(d.value)
		}
		msgs = append(msgs, m)
	}
	if err := p.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
}

// index stores ds directly, as the Indexer would have read them at offsets
// from first on (for store tests that need no Kafka).
func index(t *testing.T, pool *pgxpool.Pool, first int64, ds ...dead) {
	t.Helper()
	batch := make([]*sarama.ConsumerMessage, 0, len(ds))
	for i, d := range ds {
		m := &sarama.ConsumerMessage{Topic: d.topic, Partition: d.partition, Offset: first + int64(i), Key: []byte(d.key), Timestamp: time.Now()}
		if !d.stub {
			m.Value = d.value
		}
		for _, h := range d.headers() {
			m.Headers = append(m.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		batch = append(batch, m)
	}
	if err := store(testenv.Context(t), pool, batch, defaultMaxValueBytes); err != nil {
		t.Fatal(err)
	}
}

// count returns an integer query result.
func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// runIndexer runs ix until the test ends.
func runIndexer(t *testing.T, ix *Indexer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Indexer.Run: %v", err)
		}
	})
}

// waitCount waits until sql returns want.
func waitCount(t *testing.T, pool *pgxpool.Pool, want int64, sql string, args ...any) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := count(t, pool, sql, args...); n != want {
			return fmt.Errorf("%s = %d, want %d", sql, n, want)
		}
		return nil
	})
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// groupLag sums end offset minus group's committed offset over topics.
func groupLag(k *testenv.Kafka, group string, topics ...string) (int64, error) {
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		return 0, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, err
	}
	var lag int64
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if err != nil {
			return 0, err
		}
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
		if err != nil {
			return 0, err
		}
		for _, p := range parts {
			end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return 0, err
			}
			committed := int64(0)
			if b := resp.GetBlock(topic, p); b != nil && b.Offset >= 0 {
				committed = b.Offset
			}
			lag += end - committed
		}
	}
	return lag, nil
}

var errNotYet = errors.New("not yet")

// fingerprint is dlq.Record.Fingerprint of a record failing with kind,
// errorType and msg.
func fingerprint(kind handler.Kind, errorType, msg string) string {
	return (&dlq.Record{Failure: retrytopic.Failure{Kind: kind, ErrorType: errorType, Error: msg}}).Fingerprint()
}

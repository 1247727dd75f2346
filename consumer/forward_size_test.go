package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

const (
	oneMiB   = 1 << 20
	fourMiB  = 4 << 20
	bigBytes = 2_000_000 // a record over sarama's and Kafka's 1 MB defaults
)

// setTopicConfig sets one config of topic (IncrementalAlterConfigs SET).
func (e *env) setTopicConfig(topic, name, value string) {
	e.t.Helper()
	err := e.k.Admin(e.t).IncrementalAlterConfig(sarama.TopicResource, topic,
		map[string]sarama.IncrementalAlterConfigsEntry{name: {Operation: sarama.IncrementalAlterConfigsOperationSet, Value: &value}}, false)
	if err != nil {
		e.t.Fatalf("set %s=%s on %s: %v", name, value, topic, err)
	}
}

// preCreate creates one of idem's topics for e (before Run does) with configs.
func (e *env) preCreate(name string, configs map[string]string) {
	e.t.Helper()
	entries := map[string]*string{}
	for k, v := range configs {
		entries[k] = &v
	}
	if err := e.k.Admin(e.t).CreateTopic(name, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1, ConfigEntries: entries}, false); err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
	e.k.WaitTopic(e.t, name, 1)
}

// sizeRecord is one record of the forward tests: its idempotency key, Kafka
// key (nil: none) and value.
type sizeRecord struct {
	key      string
	kafkaKey []byte
	value    []byte
}

// produceLarge sends recs to partition 0 of e.topic with a producer allowing
// records of up to 8 MiB.
func (e *env) produceLarge(recs ...sizeRecord) {
	e.t.Helper()
	p := e.bigProducer()
	for _, r := range recs {
		m := &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.ByteEncoder(r.value),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(r.key)}}}
		if r.kafkaKey != nil {
			m.Key = sarama.ByteEncoder(r.kafkaKey)
		}
		if _, _, err := p.SendMessage(m); err != nil {
			e.t.Fatalf("produce %s: %v", r.key, err)
		}
	}
}

// big returns n bytes of a recognisable pattern.
func big(n int) []byte {
	return bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
}

// failKeys is a handler that fails the listed keys with the given error and
// applies every other message as one effects row.
func failKeys(fail map[string]error) handler.Func {
	var mu sync.Mutex
	return func(ctx context.Context, m *handler.Message) error {
		mu.Lock()
		err := fail[m.IdempotencyKey]
		mu.Unlock()
		if err != nil {
			return err
		}
		return effectHandler()(ctx, m)
	}
}

// waitEffect waits until key has been applied once.
func (e *env) waitEffect(key string, timeout time.Duration) {
	e.t.Helper()
	testenv.Eventually(e.t, timeout, func() error {
		if n := e.count(`SELECT count(*) FROM effects WHERE key = $1`, key); n != 1 {
			return fmt.Errorf("%s applied %d times", key, n)
		}
		return nil
	})
}

// onlyDLQRecord waits for the single record of the DLQ and returns it.
func (e *env) onlyDLQRecord(timeout time.Duration) *sarama.ConsumerMessage {
	e.t.Helper()
	testenv.Eventually(e.t, timeout, func() error {
		if n := e.total(e.dlq(), 1); n != 1 {
			return fmt.Errorf("DLQ has %d records, want 1", n)
		}
		return nil
	})
	return e.readAll(e.dlq(), 1)[0]
}

// Issue 8: on a source topic allowing 4 MiB, a 2 MB record that fails
// permanently reaches the DLQ whole (the DLQ is created with the source's
// max.message.bytes, the producer's limit follows it), and the partition
// moves on.
func TestLargeRecordReachesDLQWhole(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.setTopicConfig(e.topic, "max.message.bytes", strconv.Itoa(fourMiB))
	cfg := e.config()
	value := big(bigBytes)
	e.produceLarge(sizeRecord{key: "large", kafkaKey: []byte("k"), value: value}, sizeRecord{key: "after", kafkaKey: []byte("k"), value: []byte(`{}`)})
	start(t, cfg, failKeys(map[string]error{"large": handler.Permanent(errors.New("cannot apply"))}))
	e.waitEffect("after", 60*time.Second)
	m := e.onlyDLQRecord(30 * time.Second)
	if !bytes.Equal(m.Value, value) {
		t.Fatalf("DLQ value is %d bytes, want the whole %d", len(m.Value), len(value))
	}
	f, _, err := wire.Decode(m.Headers)
	if err != nil || f.Stub || f.Kind != handler.KindPermanent || f.OriginalTopic != e.topic || f.OriginalOffset != 0 {
		t.Fatalf("DLQ headers = %+v, %v", f, err)
	}
	e.waitCommitted(e.topic, 1, 30*time.Second)
}

// Issue 8: a DLQ that exists with max.message.bytes = 1 MiB beside a source
// allowing 4 MiB: a 2 MB permanent failure is dead-lettered as a stub (nil
// value, idem-payload-omitted, the reason, origin headers), counted, and the
// partition moves on to the next record.
func TestRecordTooLargeForDLQBecomesStub(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.setTopicConfig(e.topic, "max.message.bytes", strconv.Itoa(fourMiB))
	e.preCreate(e.dlq(), map[string]string{"max.message.bytes": strconv.Itoa(oneMiB)})
	cfg := e.config()
	e.produceLarge(sizeRecord{key: "large", kafkaKey: []byte("k"), value: big(bigBytes)}, sizeRecord{key: "after", kafkaKey: []byte("k"), value: []byte(`{}`)})
	start(t, cfg, failKeys(map[string]error{"large": handler.Permanent(errors.New("cannot apply"))}))
	e.waitEffect("after", 60*time.Second)
	m := e.onlyDLQRecord(30 * time.Second)
	if m.Value != nil {
		t.Fatalf("stub value is %d bytes, want nil", len(m.Value))
	}
	if string(m.Key) != "k" || header(m, "idempotency-key") != "large" {
		t.Errorf("stub lost its key or original headers: key %q, idempotency-key %q", m.Key, header(m, "idempotency-key"))
	}
	if got := header(m, wire.HeaderPayloadOmitted); got != strconv.Itoa(bigBytes) {
		t.Errorf("%s = %q, want %d", wire.HeaderPayloadOmitted, got, bigBytes)
	}
	f, _, err := wire.Decode(m.Headers)
	if err != nil || !f.Stub || f.OmittedBytes != bigBytes || f.Kind != handler.KindPermanent || f.Error != "cannot apply" ||
		f.OriginalTopic != e.topic || f.OriginalPartition != 0 || f.OriginalOffset != 0 || f.Group != e.group || f.Tier != 0 {
		t.Fatalf("stub headers = %+v, %v", f, err)
	}
	if !errors.Is(errors.New(f.ForwardError), sarama.ErrMessageSizeTooLarge) && !bytes.Contains([]byte(f.ForwardError), []byte(sarama.ErrMessageSizeTooLarge.Error())) {
		t.Errorf("%s = %q, want the broker's MESSAGE_TOO_LARGE", wire.HeaderForwardError, f.ForwardError)
	}
	if v := metricValue(t, e, "idem_stubs_forwarded_total", map[string]string{"destination": e.dlq()}); v != 1 {
		t.Errorf("idem_stubs_forwarded_total = %v, want 1", v)
	}
	if v := metricValue(t, e, "idem_messages_total", map[string]string{"outcome": "dead_lettered"}); v != 1 {
		t.Errorf("dead_lettered = %v, want 1", v)
	}
	e.waitCommitted(e.topic, 1, 30*time.Second)
}

// Issue 8, another permanent producer error, from the real broker: a retry
// tier that is compacted refuses a record without a Kafka key
// (INVALID_RECORD). The record goes to the DLQ whole, saying why, and the
// partition moves on.
func TestTierRefusingRecordSendsItToDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.preCreate(e.tier(1), map[string]string{"cleanup.policy": "compact"})
	cfg := e.config()
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second}}
	e.produceLarge(sizeRecord{key: "keyless", value: []byte(`{"n":1}`)}, sizeRecord{key: "after", value: []byte(`{}`)})
	start(t, cfg, failKeys(map[string]error{"keyless": errors.New("try later")}))
	e.waitEffect("after", 60*time.Second)
	m := e.onlyDLQRecord(30 * time.Second)
	f, _, err := wire.Decode(m.Headers)
	if err != nil || f.Stub || f.Kind != handler.KindRetriable || f.Tier != 0 || !f.DueAt.IsZero() || f.OriginalTopic != e.topic {
		t.Fatalf("DLQ headers = %+v, %v", f, err)
	}
	if !bytes.Contains([]byte(f.ForwardError), []byte(sarama.ErrInvalidRecord.Error())) {
		t.Errorf("%s = %q, want the broker's INVALID_RECORD", wire.HeaderForwardError, f.ForwardError)
	}
	if string(m.Value) != `{"n":1}` || m.Key != nil {
		t.Errorf("DLQ record changed: key %q value %q", m.Key, m.Value)
	}
	if n := e.total(e.tier(1), 1); n != 0 {
		t.Errorf("tier 1 has %d records, want 0", n)
	}
	e.waitCommitted(e.topic, 1, 30*time.Second)
}

// uncompactDLQ sets the DLQ's cleanup.policy to delete and waits until a
// keyless probe record (header test-probe) shows the broker applied it.
func (e *env) uncompactDLQ() {
	e.t.Helper()
	e.setTopicConfig(e.dlq(), "cleanup.policy", "delete")
	probe := e.k.Producer(e.t)
	testenv.Eventually(e.t, 60*time.Second, func() error {
		_, _, err := probe.SendMessage(&sarama.ProducerMessage{Topic: e.dlq(), Value: sarama.StringEncoder("probe"),
			Headers: []sarama.RecordHeader{{Key: []byte("test-probe"), Value: []byte("1")}}})
		return err
	})
}

// Issue 8: when the DLQ refuses even the stub for good (a compacted DLQ and a
// record without a Kafka key), the partition waits like an outage: the
// offset is not marked and nothing is lost. Once the DLQ accepts it, the
// record lands whole and the partition moves on.
func TestDLQRefusingStubWaitsNeverLoses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.preCreate(e.dlq(), map[string]string{"cleanup.policy": "compact"})
	cfg := e.config()
	cfg.OutageBackoff = 200 * time.Millisecond
	e.produceLarge(sizeRecord{key: "keyless", value: []byte(`{"n":1}`)}, sizeRecord{key: "after", value: []byte(`{}`)})
	h := failKeys(map[string]error{"keyless": handler.Permanent(errors.New("no"))})
	run := start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		// Each round tries the whole record, then the stub.
		if v := metricValue(t, e, "idem_forward_errors_total", map[string]string{"destination": e.dlq()}); v < 4 {
			return fmt.Errorf("forward errors %v", v)
		}
		return nil
	})
	if got := e.committed(e.topic, 1)[0]; got > 0 {
		t.Fatalf("committed offset %d while the DLQ refuses the record, want none", got)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 0 && cfg.Concurrency == 1 {
		t.Fatalf("%d effects while the partition waits, want 0", n) // with lanes "after" may run in another lane; its offset waits
	}
	// The topic-config change takes effect on the broker some time after the
	// call returns: a round running then could see the whole record refused
	// and its stub accepted. So Run is stopped while the config changes, a
	// keyless probe shows the DLQ accepts such records, and a new Run forwards
	// the record whole.
	if err := run.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	e.uncompactDLQ()
	start(t, cfg, h)
	e.waitEffect("after", 60*time.Second)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.total(e.dlq(), 1); n != 2 {
			return fmt.Errorf("DLQ has %d records, want the probe and the record", n)
		}
		return nil
	})
	var m *sarama.ConsumerMessage
	for _, r := range e.readAll(e.dlq(), 1) {
		if header(r, "test-probe") == "" {
			m = r
		}
	}
	if m == nil {
		t.Fatal("the DLQ holds only the probe")
	}
	if string(m.Value) != `{"n":1}` || header(m, wire.HeaderPayloadOmitted) != "" {
		t.Fatalf("DLQ record = %q with %s=%q, want the whole record", m.Value, wire.HeaderPayloadOmitted, header(m, wire.HeaderPayloadOmitted))
	}
	e.waitCommitted(e.topic, 1, 30*time.Second)
}

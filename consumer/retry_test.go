package consumer_test

import (
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

// readAll reads every record of topic (all partitions) up to its end offsets.
func (e *env) readAll(topic string, partitions int32) []*sarama.ConsumerMessage {
	e.t.Helper()
	c, err := sarama.NewConsumer(e.k.Brokers, e.k.SaramaConfig())
	if err != nil {
		e.t.Fatal(err)
	}
	defer c.Close()
	ends := e.endOffsets(topic, partitions)
	var out []*sarama.ConsumerMessage
	for p := range partitions {
		if ends[p] == 0 {
			continue
		}
		pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
		if err != nil {
			e.t.Fatal(err)
		}
		for m := range pc.Messages() {
			out = append(out, m)
			if m.Offset+1 >= ends[p] {
				break
			}
		}
		pc.Close()
	}
	return out
}

func (e *env) total(topic string, partitions int32) int64 {
	var n int64
	for _, o := range e.endOffsets(topic, partitions) {
		n += o
	}
	return n
}

func (e *env) dlq() string       { return e.topic + "." + e.group + ".dlq" }
func (e *env) tier(n int) string { return retrytopic.Policy{}.Tier(e.topic, e.group, n) }
func header(m *sarama.ConsumerMessage, k string) string {
	for _, h := range m.Headers {
		if string(h.Key) == k {
			return string(h.Value)
		}
	}
	return ""
}

// Issue 4, test 1: a handler failing twice, then succeeding → one effect;
// the in-process retry and the tier are visible in metrics.
func TestFailTwiceThenSucceed(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 2).in(mode)
		cfg := e.config()
		cfg.Retry.Attempts = 2 // attempt 1 and its one in-process retry fail; tier 1 succeeds
		cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{200 * time.Millisecond}}
		var mu sync.Mutex
		attempts := map[string][]int{}
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			mu.Lock()
			attempts[m.IdempotencyKey] = append(attempts[m.IdempotencyKey], m.Attempt)
			n := len(attempts[m.IdempotencyKey])
			mu.Unlock()
			if n <= 2 {
				return errors.New("flaky dependency")
			}
			return effectHandler()(ctx, m)
		})
		e.produce([]string{"a", "b", "c"}, 2)
		start(t, cfg, h)
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM effects`); n != 3 {
				return fmt.Errorf("%d effects", n)
			}
			return nil
		})
		e.waitCommitted(e.topic, 2, 30*time.Second)
		e.waitCommitted(e.tier(1), 2, 30*time.Second)
		if n := e.count(`SELECT count(*) FROM effects`); n != 3 {
			t.Fatalf("effects = %d, want 3", n)
		}
		mu.Lock()
		for k, a := range attempts {
			if fmt.Sprint(a) != "[1 2 3]" {
				t.Errorf("key %s attempts %v, want [1 2 3]", k, a)
			}
		}
		mu.Unlock()
		if got := metricValue(t, e, "idem_retries_total", map[string]string{"group": e.group, "topic": e.topic}); got != 3 {
			t.Errorf("idem_retries_total = %v, want 3", got)
		}
		if got := metricValue(t, e, "idem_forwarded_total", map[string]string{"destination": e.tier(1)}); got != 3 {
			t.Errorf("idem_forwarded_total{destination=tier1} = %v, want 3", got)
		}
		if got := metricValue(t, e, "idem_messages_total", map[string]string{"topic": e.tier(1), "outcome": "processed"}); got != 3 {
			t.Errorf("processed from tier 1 = %v, want 3", got)
		}
		if n := e.total(e.dlq(), 2); n != 0 {
			t.Errorf("DLQ has %d records, want 0", n)
		}
	})
}

// Issue 4, test 2: always failing → through every tier, each delay never
// shorter than configured, then the DLQ with every header right.
func TestAlwaysFailingReachesDLQThroughTiers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	cfg := e.config()
	cfg.Retry.Attempts = 1
	delays := []time.Duration{500 * time.Millisecond, time.Second}
	cfg.Retry.Tiers = retrytopic.Policy{Delays: delays}
	type call struct {
		at      time.Time
		attempt int
		topic   string
	}
	var mu sync.Mutex
	calls := map[string][]call{}
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		mu.Lock()
		calls[m.IdempotencyKey] = append(calls[m.IdempotencyKey], call{time.Now().Round(0), m.Attempt, m.Topic}) // wall clock, as idem-due-at
		mu.Unlock()
		return fmt.Errorf("bank said no to %s", m.IdempotencyKey)
	})
	keys := []string{"k0", "k1", "k2", "k3"}
	e.produce(keys, 3)
	src := e.endOffsets(e.topic, 3)
	start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.total(e.dlq(), 3); n != int64(len(keys)) {
			return fmt.Errorf("DLQ has %d of %d", n, len(keys))
		}
		return nil
	})
	e.waitCommitted(e.topic, 3, 30*time.Second)
	for _, m := range e.readAll(e.dlq(), 3) {
		k := string(m.Key)
		f, ok, err := wire.Decode(m.Headers)
		if !ok || err != nil {
			t.Fatalf("DLQ record %s: headers ok=%v err=%v", k, ok, err)
		}
		idx := 0
		for i, kk := range keys {
			if kk == k {
				idx = i
			}
		}
		want := retrytopic.Failure{Attempt: 3, Tier: 0, OriginalTopic: e.topic, OriginalPartition: int32(idx % 3), Group: e.group,
			Kind: handler.KindRetriable, Error: "bank said no to " + k, ErrorType: "*errors.errorString"}
		if f.Attempt != want.Attempt || f.Tier != 0 || f.OriginalTopic != want.OriginalTopic || f.OriginalPartition != want.OriginalPartition ||
			f.Group != want.Group || f.Kind != want.Kind || f.Error != want.Error || f.ErrorType != want.ErrorType {
			t.Errorf("DLQ record %s: got %+v, want %+v", k, f, want)
		}
		if f.OriginalOffset < 0 || f.OriginalOffset >= src[f.OriginalPartition] {
			t.Errorf("original offset %d outside the source partition", f.OriginalOffset)
		}
		if f.FirstFailureAt.IsZero() || f.LastFailureAt.Before(f.FirstFailureAt) || f.OriginalTimestamp.IsZero() {
			t.Errorf("failure times wrong: %+v", f)
		}
		if header(m, "idempotency-key") != k {
			t.Errorf("original header lost on %s", k)
		}
		if m.Partition != f.OriginalPartition {
			t.Errorf("DLQ partition %d, want the source's %d", m.Partition, f.OriginalPartition)
		}
		if string(m.Value) != fmt.Sprintf(`{"n":%d}`, idx) {
			t.Errorf("value changed: %q", m.Value)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for k, cs := range calls {
		if len(cs) != 3 {
			t.Fatalf("key %s handled %d times, want 3 (source, tier 1, tier 2)", k, len(cs))
		}
		for i := 1; i < 3; i++ {
			if gap := cs[i].at.Sub(cs[i-1].at); gap < delays[i-1] {
				t.Errorf("key %s: tier %d ran %s after the failure, sooner than its delay %s", k, i, gap, delays[i-1])
			}
			if cs[i].topic != e.tier(i) || cs[i].attempt != i+1 {
				t.Errorf("key %s call %d: topic %s attempt %d", k, i, cs[i].topic, cs[i].attempt)
			}
		}
	}
}

// Issue 4, tests 3 and 4: a permanent error and poison bytes go to the DLQ at
// once, skipping the tiers, with the value bytes unchanged.
func TestPermanentAndPoisonGoStraightToDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second}}
	cfg.DLQDepthInterval = 100 * time.Millisecond
	var calls sync.Map
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		n, _ := calls.LoadOrStore(m.IdempotencyKey, new(int))
		*(n.(*int))++
		var v struct{ N int }
		if err := jsonUnmarshal(m.Value, &v); err != nil {
			return handler.Decode(err)
		}
		return handler.Permanent(errors.New("order unknown"))
	})
	p := e.k.Producer(t)
	poison := []byte{0xff, 0x00, '{', 0xfe, '"'}
	for i, v := range [][]byte{[]byte(`{"n":1}`), poison} {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.ByteEncoder(v),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("key-" + strconv.Itoa(i))}}}); err != nil {
			t.Fatal(err)
		}
	}
	start(t, cfg, h)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.total(e.dlq(), 1); n != 2 {
			return fmt.Errorf("DLQ has %d of 2", n)
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 30*time.Second)
	got := e.readAll(e.dlq(), 1)
	if k := header(got[0], wire.HeaderErrorKind); k != "permanent" {
		t.Errorf("first kind %q, want permanent", k)
	}
	if k := header(got[1], wire.HeaderErrorKind); k != "decode" {
		t.Errorf("poison kind %q, want decode", k)
	}
	if string(got[1].Value) != string(poison) {
		t.Errorf("poison bytes changed: %x, want %x", got[1].Value, poison)
	}
	if n := e.total(e.tier(1), 1); n != 0 {
		t.Errorf("tier 1 has %d records, want 0", n)
	}
	// The consumer exports the DLQ depth (nothing replayed or purged yet).
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := metricValue(t, e, "idem_dlq_depth", map[string]string{"topic": e.dlq()}); v != 2 {
			return fmt.Errorf("idem_dlq_depth = %v, want 2", v)
		}
		return nil
	})
	calls.Range(func(k, v any) bool {
		if *(v.(*int)) != 1 {
			t.Errorf("key %v handled %d times, want 1 (no retries)", k, *(v.(*int)))
		}
		return true
	})
}

// Issue 4, test 5: the forward is refused (the DLQ topic is gone) → no offset
// is marked and nothing is lost; once the topic returns the message lands.
func TestRefusedForwardMarksNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.OutageBackoff = 200 * time.Millisecond
	cfg.Sarama.Producer.Retry.Max = 1
	cfg.Sarama.Metadata.Retry.Max = 1
	ready := make(chan struct{})
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.IdempotencyKey == "first" {
			close(ready)
			return effectHandler()(ctx, m)
		}
		return handler.Permanent(errors.New("rejected"))
	})
	e.produce([]string{"first"}, 1)
	start(t, cfg, h)
	<-ready
	e.waitCommitted(e.topic, 1, 30*time.Second)
	// The consumer created the DLQ at start; take it away.
	e.k.DeleteTopics(t, e.dlq())
	testenv.Eventually(t, 30*time.Second, func() error {
		ts, err := e.k.Admin(t).ListTopics()
		if err != nil {
			return err
		}
		if _, ok := ts[e.dlq()]; ok {
			return errors.New("DLQ still listed")
		}
		return nil
	})
	e.produce([]string{"doomed"}, 1)
	testenv.Eventually(t, 60*time.Second, func() error {
		if v := metricValue(t, e, "idem_forward_errors_total", map[string]string{"destination": e.dlq()}); v < 2 {
			return fmt.Errorf("forward errors %v", v)
		}
		return nil
	})
	if got, end := e.committed(e.topic, 1)[0], e.endOffsets(e.topic, 1)[0]; got != end-1 {
		t.Fatalf("committed %d while the forward fails, want %d (the failing message unmarked)", got, end-1)
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		err := e.k.Admin(t).CreateTopic(e.dlq(), &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false)
		if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
			return err
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 60*time.Second)
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.total(e.dlq(), 1); n != 1 {
			return fmt.Errorf("DLQ has %d records, want 1", n)
		}
		return nil
	})
}

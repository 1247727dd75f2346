package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// TestNoKeysInFirstRecordsWarnsOnce: a topic whose producers never set the
// idempotency-key header makes Run log one WARN naming the KeyFunc in use,
// however many records follow; the records go to the DLQ as before.
func TestNoKeysInFirstRecordsWarnsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	var logs logBuffer
	cfg := e.config()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := e.k.Producer(t)
	const n = 25
	for i := range n {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: int32(i % 2),
			Key: sarama.StringEncoder(fmt.Sprint("order-", i)), Value: sarama.StringEncoder(`{"id":1}`)}); err != nil {
			t.Fatal(err)
		}
	}
	start(t, cfg, effectHandler())
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := e.total(e.dlq(), 2); got != n {
			return fmt.Errorf("DLQ has %d of %d", got, n)
		}
		return nil
	})
	out := logs.String()
	if c := strings.Count(out, "the first records of a topic have no idempotency key"); c != 1 {
		t.Fatalf("%d key warnings, want 1; logs:\n%s", c, out)
	}
	for _, want := range []string{"key_func=consumer.HeaderKey", "topic=" + e.topic, `HeaderKey(\"idempotency-key\"): no header`, "MissingKeyDeadLetter"} {
		if !strings.Contains(out, want) {
			t.Errorf("warning lacks %q; logs:\n%s", want, out)
		}
	}
}

// TestKeyExtractorsEndToEnd: JSONField and RecordKey through FirstOf find
// keys in records without the header, so nothing is dead-lettered and
// duplicates of a JSON key have one effect.
func TestKeyExtractorsEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.KeyFunc = consumer.FirstOf(consumer.JSONField("meta.event_id"), consumer.RecordKey())
	p := e.k.Producer(t)
	send := func(key, value string) {
		m := &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder(value)}
		if key != "" {
			m.Key = sarama.StringEncoder(key)
		}
		if _, _, err := p.SendMessage(m); err != nil {
			t.Fatal(err)
		}
	}
	send("", `{"meta":{"event_id":"e-1"}}`)
	send("", `{"meta":{"event_id":"e-1"}}`) // a producer's duplicate
	send("r-2", `{"meta":{}}`)
	send("", `{"meta":{"event_id":42}}`)
	send("", `not json`) // no key at all: dead-lettered
	start(t, cfg, effectHandler())
	e.waitCommitted(e.topic, 1, 60*time.Second)
	if got := e.count(`SELECT count(*) FROM effects`); got != 3 {
		t.Errorf("%d effects, want 3 (e-1 once, r-2, 42)", got)
	}
	if got := e.count(`SELECT count(*) FROM effects WHERE key IN ('e-1','r-2','42')`); got != 3 {
		t.Errorf("keys are not e-1, r-2, 42")
	}
	if got := e.total(e.dlq(), 1); got != 1 {
		t.Errorf("DLQ has %d records, want 1 (the one without any key)", got)
	}
}

// TestMessageOriginInRetryTier: Message.Origin names the source topic,
// partition and offset both when the record is consumed from its source and
// when it comes back from a retry tier, whose Topic differs.
func TestMessageOriginInRetryTier(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	cfg := e.config()
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{100 * time.Millisecond}}
	type seen struct {
		topic  string
		origin handler.Origin
		tsOK   bool
	}
	var mu sync.Mutex
	calls := map[string][]seen{}
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		mu.Lock()
		calls[m.IdempotencyKey] = append(calls[m.IdempotencyKey], seen{m.Topic, m.Origin(), !m.Origin().Timestamp.IsZero()})
		mu.Unlock()
		if m.Attempt == 1 {
			return fmt.Errorf("first attempt of %s fails", m.IdempotencyKey)
		}
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO effects(key) VALUES ($1)`, m.IdempotencyKey)
		return err
	})
	e.produce([]string{"a", "b", "c"}, 2)
	start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects`); n != 3 {
			return fmt.Errorf("%d of 3 handled", n)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for i, k := range []string{"a", "b", "c"} {
		cs := calls[k]
		if len(cs) != 2 {
			t.Fatalf("%s: %d calls, want 2", k, len(cs))
		}
		src, tier := cs[0], cs[1]
		if src.topic != e.topic || tier.topic != e.tier(1) {
			t.Errorf("%s: topics %q then %q, want %q then %q", k, src.topic, tier.topic, e.topic, e.tier(1))
		}
		if src.origin != tier.origin || src.origin.Topic != e.topic || src.origin.Partition != int32(i%2) || !src.tsOK {
			t.Errorf("%s: origin %+v at the source, %+v in the tier; want both on %s/%d with a timestamp", k, src.origin, tier.origin, e.topic, i%2)
		}
	}
}

func TestMessageOriginOfHandBuiltMessage(t *testing.T) {
	m := &handler.Message{Topic: "t", Partition: 2, Offset: 7}
	if o := m.Origin(); o.Topic != "t" || o.Partition != 2 || o.Offset != 7 {
		t.Fatalf("Origin() = %+v", o)
	}
}

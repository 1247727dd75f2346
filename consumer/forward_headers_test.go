package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// Issue 18 #12 and issue 19: a record forwarded to a tier and then to the
// DLQ keeps its own idem-… headers that are not the wire contract's (here
// outbox.Relay's idem-outbox-id), the handler sees it in the tier, and both
// forwarded records name the idempotency key idem derived (here from a JSON
// field) in idem-idempotency-key.
func TestForwardKeepsOwnHeadersAndNamesTheKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.KeyFunc = consumer.JSONField("id")
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{100 * time.Millisecond}}
	seen := make(chan string, 4)
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		v, _ := m.Header("idem-outbox-id")
		seen <- string(v)
		if m.Attempt == 1 {
			return errors.New("first try fails")
		}
		return handler.Permanent(errors.New("then for good"))
	})
	p := e.k.Producer(t)
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder(`{"id":"order-7"}`),
		Headers: []sarama.RecordHeader{{Key: []byte("idem-outbox-id"), Value: []byte("42")}}}); err != nil {
		t.Fatal(err)
	}
	start(t, cfg, h)
	for i := range 2 {
		select {
		case v := <-seen:
			if v != "42" {
				t.Fatalf("delivery %d: handler saw idem-outbox-id %q, want 42", i+1, v)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("delivery %d never came", i+1)
		}
	}
	m := e.onlyDLQRecord(30 * time.Second)
	tier := e.readAll(e.tier(1), 1)
	for _, r := range append(tier, m) {
		if got := header(r, "idem-outbox-id"); got != "42" {
			t.Errorf("%s: idem-outbox-id = %q, want 42", r.Topic, got)
		}
		if got := header(r, wire.HeaderIdempotencyKey); got != "order-7" {
			t.Errorf("%s: %s = %q, want order-7", r.Topic, wire.HeaderIdempotencyKey, got)
		}
	}
}

// Issue 18 #14: a keyless record whose own headers alone are larger than
// the dead-letter topic takes (so even a stub without its value is refused)
// is dead-lettered as a bare stub: idem's headers only, idem-headers-omitted
// saying how many of its own were left out. The partition moves on.
func TestHeadersTooLargeForTheDLQEndInABareStub(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.preCreate(e.dlq(), map[string]string{"max.message.bytes": "4000"})
	cfg := e.config()
	m := &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder("v"),
		Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("huge")}}}
	for i := range 10 {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: fmt.Appendf(nil, "h%d", i), Value: big(1000)})
	}
	p := e.bigProducer()
	if _, _, err := p.SendMessage(m); err != nil {
		t.Fatal(err)
	}
	e.produceLarge(sizeRecord{key: "after", value: []byte(`{}`)})
	start(t, cfg, failKeys(map[string]error{"huge": handler.Permanent(errors.New("cannot apply"))}))
	e.waitEffect("after", 60*time.Second)
	d := e.onlyDLQRecord(30 * time.Second)
	if got := header(d, wire.HeaderHeadersOmitted); got != "11" {
		t.Fatalf("%s = %q, want 11 (its own headers)", wire.HeaderHeadersOmitted, got)
	}
	if got := header(d, wire.HeaderIdempotencyKey); got != "huge" || header(d, "h0") != "" {
		t.Fatalf("bare stub: key %q, h0 %d bytes", got, len(header(d, "h0")))
	}
}

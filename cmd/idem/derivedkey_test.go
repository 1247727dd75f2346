package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/retrytopic"
)

// TestCLIFindsTheKeyTheConsumerDerived, end to end: a consumer whose
// idempotency key comes from the body (consumer.JSONField) dead-letters a
// record whose Kafka key and headers say something else; idem dlq show
// --key and replay --filter key= find it by the key the consumer derived.
func TestCLIFindsTheKeyTheConsumerDerived(t *testing.T) {
	k := idemtest.Connect(t)
	source, group := k.Topic(t, "payments", 1), k.Group(t, "billing")
	dlqTopic := retrytopic.Policy{}.DLQ(source, group) // deleted with source
	k.Produce(t, source, idemtest.Record{Key: []byte("customer-9"), Value: []byte(`{"payment_id":"pay-9","amount":10}`)})
	cfg := k.Config(t, group, source)
	cfg.KeyFunc = consumer.JSONField("payment_id")
	c := idemtest.Start(t, cfg, handler.Func(func(context.Context, *handler.Message) error {
		return handler.Permanent(errors.New("ledger refused the payment"))
	}))
	c.WaitOutcome(t, "dead_lettered", 1) // counted once the DLQ acknowledged it

	code, out, _ := idem(t, k, "", "dlq", "show", "-t", dlqTopic, "--key", "pay-9")
	if code != 0 || !strings.Contains(out, `"payment_id": "pay-9"`) || !strings.Contains(out, "ledger refused the payment") {
		t.Errorf("show --key pay-9 (derived from the body): code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "-t", dlqTopic, "--filter", "key=pay-9", "--dry-run")
	if code != 0 || !strings.Contains(out, "would replay 1 of 1") {
		t.Errorf("replay --filter key=pay-9 --dry-run: code %d\n%s", code, out)
	}
}

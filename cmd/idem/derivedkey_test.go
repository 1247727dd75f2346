package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// TestCLIFindsTheKeyTheConsumerDerived, end to end: a consumer whose
// idempotency key comes from the body (consumer.JSONField) dead-letters a
// record whose Kafka key and headers say something else; idem dlq show
// --key and replay --filter key= find it by the key the consumer derived.
func TestCLIFindsTheKeyTheConsumerDerived(t *testing.T) {
	k := testenv.NewKafka(t)
	source, group := k.Topic(t, 1), testenv.Group(t)
	pol := retrytopic.Policy{}
	dlqTopic := pol.DLQ(source, group)
	t.Cleanup(func() { k.DeleteTopics(t, dlqTopic) })
	if _, _, err := k.Producer(t).SendMessage(&sarama.ProducerMessage{Topic: source, Partition: 0, Key: sarama.StringEncoder("customer-9"),
		Value: sarama.StringEncoder(`{"payment_id":"pay-9","amount":10}`)}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		err := consumer.Run(ctx, consumer.Config{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Group: group, Topics: []string{source},
			Dedupe: dedupe.NewMemory(), KeyFunc: consumer.JSONField("payment_id"), Retry: consumer.RetryConfig{Tiers: pol}},
			handler.Func(func(context.Context, *handler.Message) error {
				return handler.Permanent(errors.New("ledger refused the payment"))
			}))
		if err != nil {
			t.Errorf("consumer.Run: %v", err)
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })

	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	testenv.Eventually(t, 60*time.Second, func() error {
		if err := client.RefreshMetadata(dlqTopic); err != nil {
			return err
		}
		if end, err := client.GetOffset(dlqTopic, 0, sarama.OffsetNewest); err != nil || end < 1 {
			return errors.Join(err, errors.New("not dead-lettered yet"))
		}
		return nil
	})

	code, out, _ := idem(t, k, "", "dlq", "show", "-t", dlqTopic, "--key", "pay-9")
	if code != 0 || !strings.Contains(out, `"payment_id": "pay-9"`) || !strings.Contains(out, "ledger refused the payment") {
		t.Errorf("show --key pay-9 (derived from the body): code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "-t", dlqTopic, "--filter", "key=pay-9", "--dry-run")
	if code != 0 || !strings.Contains(out, "would replay 1 of 1") {
		t.Errorf("replay --filter key=pay-9 --dry-run: code %d\n%s", code, out)
	}
}

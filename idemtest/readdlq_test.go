package idemtest_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/committedtest"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// TestReadDLQWithTransactions: a dead-letter topic written with
// transactions (Config.Transactions) holds a commit marker after each dead
// letter, and may hold the records of aborted transactions. ReadDLQ counts
// and returns the committed dead letters only, without waiting for a record
// at a marker's offset.
func TestReadDLQWithTransactions(t *testing.T) {
	t.Parallel()
	k := idemtest.Connect(t)
	dlqTopic := k.Topic(t, "payments.billing.dlq", 1)
	dead := func(key string) *sarama.ProducerMessage {
		f := retrytopic.Failure{Attempt: 1, OriginalTopic: "payments", Group: "billing", Kind: handler.KindPermanent,
			Error: "card declined", FirstFailureAt: time.Now(), LastFailureAt: time.Now()}
		return &sarama.ProducerMessage{Topic: dlqTopic, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(`{"id":"` + key + `"}`),
			Headers: wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}, f)}
	}
	const abort = true
	committedtest.Produce(t, k.Brokers, k.SaramaConfig(), !abort, dead("pay-1")) // offset 0, its commit marker at 1
	committedtest.Produce(t, k.Brokers, k.SaramaConfig(), abort, dead("rolled-back"))
	committedtest.Produce(t, k.Brokers, k.SaramaConfig(), !abort, dead("pay-2"), dead("pay-3"))

	start := time.Now()
	got := k.ReadDLQ(t, dlqTopic, 1)
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("ReadDLQ took %s", took)
	}
	var keys []string
	for _, d := range got {
		keys = append(keys, string(d.Key))
	}
	if len(keys) != 3 || keys[0] != "pay-1" || keys[1] != "pay-2" || keys[2] != "pay-3" {
		t.Fatalf("ReadDLQ = %q, want the three committed dead letters", keys)
	}
}

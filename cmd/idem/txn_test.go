package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/committedtest"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// TestCLITransactionalDLQ: a dead-letter topic written with transactions
// (a commit marker after each dead letter, and an aborted transaction) is
// read as a read_committed consumer reads it, without a database: list
// --source --group and show --key answer (instead of hanging), and depth
// counts 5 dead letters, not 10 offsets.
func TestCLITransactionalDLQ(t *testing.T) {
	k := idemtest.Connect(t)
	source, group := k.Topic(t, "payments", 1), "billing"
	dlqTopic := retrytopic.Policy{}.DLQ(source, group)
	k.CreateTopic(t, dlqTopic, 1)
	t.Cleanup(func() { _ = admin(t, k).DeleteTopic(dlqTopic) })
	for i := range 5 {
		key := fmt.Sprint("pay-", i)
		f := retrytopic.Failure{Attempt: 1, OriginalTopic: source, OriginalOffset: int64(i), Group: group, Kind: handler.KindPermanent,
			ErrorType: "*errors.errorString", Error: "card declined", FirstFailureAt: time.Now(), LastFailureAt: time.Now()}
		m := &sarama.ProducerMessage{Topic: dlqTopic, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(`{"id":"` + key + `"}`),
			Headers: wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}, f)}
		committedtest.Produce(t, k.Brokers, k.SaramaConfig(), false, m)
	}
	aborted := &sarama.ProducerMessage{Topic: dlqTopic, Key: sarama.StringEncoder("rolled-back"), Value: sarama.StringEncoder("x")}
	committedtest.Produce(t, k.Brokers, k.SaramaConfig(), true, aborted)

	done := make(chan struct{})
	go func() {
		defer close(done)
		code, out, _ := idem(t, k, "", "dlq", "list", "--source", source, "--group", group)
		if code != 0 || !strings.Contains(out, "depth: 5 pending") || !strings.Contains(out, "card declined") {
			t.Errorf("dlq list --source --group: code %d, want 5 pending:\n%s", code, out)
		}
		code, out, _ = idem(t, k, "", "dlq", "show", "--source", source, "--group", group, "--key", "pay-3")
		if code != 0 || !strings.Contains(out, `"id": "pay-3"`) {
			t.Errorf("dlq show --key: code %d\n%s", code, out)
		}
		code, out, _ = idem(t, k, "", "dlq", "show", "--source", source, "--group", group, "--key", "rolled-back")
		if code == 0 {
			t.Errorf("dlq show --key of an aborted record: code 0, want not found\n%s", out)
		}
		code, out, _ = idem(t, k, "", "dlq", "depth", "-t", dlqTopic)
		if code != 0 || !strings.Contains(out, "total: 5 pending") {
			t.Errorf("dlq depth: code %d, want 5 pending\n%s", code, out)
		}
	}()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatal("the dlq commands did not return within 90 s")
	}
}

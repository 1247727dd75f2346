package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// seedStub writes a dead-letter stub for origin into topic: the record as the
// consumer writes it when no topic would take the value (nil value,
// idem-payload-omitted).
func seedStub(t *testing.T, k *idemtest.Kafka, topic, origin, key string) {
	t.Helper()
	now := time.Now()
	f := retrytopic.Failure{
		Attempt: 1, OriginalTopic: origin, Group: "billing", Kind: handler.KindPermanent, ErrorType: "*sarama.KError",
		Error: "kafka server: Message was too large", FirstFailureAt: now, LastFailureAt: now, Stub: true, OmittedBytes: 2 << 20,
	}
	hs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}, f)
	k.Produce(t, topic, idemtest.Record{Key: []byte(key), Headers: kitHeaders(hs)})
}

// readTopic returns every record of partition 0 of topic.
func readTopic(t *testing.T, k *idemtest.Kafka, topic string) []*sarama.ConsumerMessage {
	t.Helper()
	return readPartition(t, k, topic, 0)
}

// readPartition returns every record of partition p of topic.
func readPartition(t *testing.T, k *idemtest.Kafka, topic string, p int32) []*sarama.ConsumerMessage {
	t.Helper()
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
	if err != nil {
		t.Fatal(err)
	}
	if end == 0 {
		return nil
	}
	c, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, p, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	var out []*sarama.ConsumerMessage
	timeout := time.After(30 * time.Second)
	for len(out) == 0 || out[len(out)-1].Offset+1 < end {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case <-timeout:
			t.Fatalf("read %s: %d records, want up to offset %d", topic, len(out), end)
		}
	}
	return out
}

// TestCLIStubNeverReplayed is defect #3 of issue 18: a stub (a dead letter
// whose value was left out) must never be replayed as an empty record (on a
// compacted topic, a tombstone). list and show mark it; replay and --dry-run
// report it; replay refuses while it is pending, and with
// --drop-unmatched-from-pending sends the others and skips it.
func TestCLIStubNeverReplayed(t *testing.T) {
	k := idemtest.Connect(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, topic, origin, 2)
	seedStub(t, k, topic, origin, "big-1")

	code, out, _ := idem(t, k, "", "dlq", "list", "--topic", topic)
	if code != 0 || !strings.Contains(out, "STUBS") || !strings.Contains(out, "1 stub") {
		t.Errorf("list does not mark the stub: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "show", "--topic", topic, "--offset", "2")
	if code != 0 || !strings.Contains(out, "stub: value omitted (2097152 bytes); replay skips it") {
		t.Errorf("show does not mark the stub: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--dry-run")
	if !strings.Contains(out, "1 stub") || !strings.Contains(out, "partition 0 offset 2") {
		t.Errorf("replay --dry-run does not report the stub: code %d\n%s", code, out)
	}
	code, _, errOut := idem(t, k, "", "dlq", "replay", "--topic", topic)
	for _, m := range readTopic(t, k, origin) {
		if len(m.Value) == 0 {
			t.Fatalf("replay published an empty value for key %q at offset %d (the stub)", m.Key, m.Offset)
		}
	}
	if code == 0 || !strings.Contains(errOut, "stub") {
		t.Errorf("replay with a stub pending: code %d, want a refusal naming the stub\n%s", code, errOut)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "--topic", topic, "--drop-unmatched-from-pending")
	if code != 0 || !strings.Contains(out, "replayed 2 of 3") || !strings.Contains(out, "1 stub") {
		t.Errorf("replay --drop-unmatched-from-pending: code %d\n%s", code, out)
	}
	got := readTopic(t, k, origin)
	if len(got) != 2 {
		t.Fatalf("origin has %d records, want the 2 that are not stubs", len(got))
	}
	for i, m := range got {
		if want := fmt.Sprintf(`{"order":%d}`, i); string(m.Value) != want {
			t.Errorf("origin offset %d = %q, want %q", i, m.Value, want)
		}
	}
}

package forward_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/testing/testkit"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// consumeOne reads the record at (topic, partition, offset).
func consumeOne(t *testing.T, k *idemtest.Kafka, topic string, partition int32, offset int64) *sarama.ConsumerMessage {
	t.Helper()
	c, err := sarama.NewConsumer(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, partition, offset)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	select {
	case m := <-pc.Messages():
		return m
	case err := <-pc.Errors():
		t.Fatal(err)
	case <-time.After(30 * time.Second):
		t.Fatalf("no record at %s/%d@%d", topic, partition, offset)
	}
	return nil
}

// newAdmin returns a cluster admin on k, closed when the test ends.
func newAdmin(t *testing.T, k *idemtest.Kafka) sarama.ClusterAdmin {
	t.Helper()
	return testkit.Admin(t, k.Brokers, k.SaramaConfig())
}

// waitPartitions waits until the broker describes topic with n partitions.
func waitPartitions(t *testing.T, admin sarama.ClusterAdmin, topic string, n int) {
	t.Helper()
	idemtest.Eventually(t, 30*time.Second, func() error {
		ds, err := admin.DescribeTopics([]string{topic})
		if err != nil {
			return err
		}
		if len(ds) != 1 || !errors.Is(ds[0].Err, sarama.ErrNoError) || len(ds[0].Partitions) != n {
			return fmt.Errorf("topic %s: %+v, want %d partitions", topic, ds, n)
		}
		return nil
	})
}

func newForwarder(t *testing.T, k *idemtest.Kafka) (*forward.Forwarder, sarama.Client) {
	t.Helper()
	cfg := k.SaramaConfig()
	retrytopic.ConfigureProducer(cfg)
	client, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	f, err := forward.NewForwarderFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f, client
}

func TestForwardKeepsBytesAndPartition(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	dest := k.Topic(t, "dest", 4)
	small := k.Topic(t, "small", 2)
	fwd, client := newForwarder(t, k)

	orig := []*sarama.RecordHeader{
		{Key: []byte("idempotency-key"), Value: []byte("pay-42")},
		{Key: []byte(wire.HeaderAttempt), Value: []byte("1")}, // from an earlier tier: replaced
		{Key: []byte("bin"), Value: []byte{0, 1, 0xfe}},
	}
	prior, _, _ := wire.Decode(orig)
	f := wire.NewFailure(handler.Permanent(errors.New("card declined")),
		wire.Source{Topic: "payments", Partition: 3, Offset: 9, Timestamp: time.UnixMilli(1_700_000_000_000), Group: "billing"},
		prior, time.Now())
	hs := wire.Encode(orig, f)

	value := []byte{0x00, 0xff, '{', '"', 0x80} // not UTF-8, not JSON: must arrive unchanged
	tests := []struct {
		name  string
		topic string
		part  int32
		key   []byte
		value []byte
		wantP func(n int32) int32
	}{
		{"same partition", dest, 3, []byte("key-a"), value, func(int32) int32 { return 3 }},
		{"tombstone stays nil", dest, 1, []byte("key-b"), nil, func(int32) int32 { return 1 }},
		{"empty value stays empty", dest, 2, nil, []byte{}, func(int32) int32 { return 2 }},
		{"fewer partitions: hash of key", small, 3, []byte("key-a"), value, func(n int32) int32 {
			p, _ := sarama.NewHashPartitioner(small).Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder("key-a")}, n)
			return p
		}},
		{"fewer partitions, nil key: modulo", small, 3, nil, value, func(n int32) int32 { return 3 % n }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, _ := client.Partitions(tt.topic)
			wantP := tt.wantP(int32(len(ps)))
			before, err := client.GetOffset(tt.topic, wantP, sarama.OffsetNewest)
			if err != nil {
				t.Fatal(err)
			}
			err = fwd.Forward(ctx, forward.Record{Topic: tt.topic, Partition: tt.part, Key: tt.key, Value: tt.value, Headers: hs})
			if err != nil {
				t.Fatalf("Forward: %v", err)
			}
			m := consumeOne(t, k, tt.topic, wantP, before)
			if !bytes.Equal(m.Key, tt.key) || (m.Key == nil) != (tt.key == nil) {
				t.Errorf("key = %q, want %q", m.Key, tt.key)
			}
			if !bytes.Equal(m.Value, tt.value) || (m.Value == nil) != (tt.value == nil) {
				t.Errorf("value = %v (nil %v), want %v (nil %v)", m.Value, m.Value == nil, tt.value, tt.value == nil)
			}
			if len(m.Headers) != len(hs) {
				t.Fatalf("%d headers, want %d", len(m.Headers), len(hs))
			}
			for i, h := range m.Headers {
				if !bytes.Equal(h.Key, hs[i].Key) || !bytes.Equal(h.Value, hs[i].Value) {
					t.Errorf("header %d = %q=%q, want %q=%q", i, h.Key, h.Value, hs[i].Key, hs[i].Value)
				}
			}
			got, ok, err := wire.Decode(m.Headers)
			if err != nil || !ok || got.OriginalTopic != "payments" || got.Kind != handler.KindPermanent || got.Error != "card declined" {
				t.Errorf("decoded %+v ok=%v err=%v", got, ok, err)
			}
			n := 0
			for _, h := range m.Headers {
				if string(h.Key) == wire.HeaderAttempt {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%s appears %d times", wire.HeaderAttempt, n)
			}
		})
	}
}

func TestForwardErrorIsTyped(t *testing.T) {
	k := idemtest.Connect(t)
	fwd, _ := newForwarder(t, k)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := fwd.Forward(ctx, forward.Record{Topic: "whatever", Value: []byte("x")})
	var fe *forward.ForwardError
	if !errors.As(err, &fe) || fe.Topic != "whatever" || !errors.Is(err, context.Canceled) {
		t.Fatalf("Forward(cancelled) = %v, want *ForwardError wrapping context.Canceled", err)
	}
}

func TestEnsureTopics(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	admin := newAdmin(t, k)
	src := k.Topic(t, "src", 3) // its tiers and DLQ are deleted with it when the test ends
	group := k.Group(t, "g")
	pol := retrytopic.Policy{Delays: []time.Duration{time.Second, time.Minute}, Retention: 2 * time.Hour}
	topics := pol.Topics(src, group)

	// Concurrent callers: all succeed.
	errs := make(chan error, 3)
	for range 3 {
		go func() { errs <- forward.EnsureTopics(ctx, admin, topics, 3, pol) }()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("EnsureTopics: %v", err)
		}
	}
	for _, name := range topics {
		waitPartitions(t, admin, name, 3)
		//lint:ignore SA1019 DescribeConfig is the call sarama's mock-free admin offers for one resource; fine in a test
		entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: name, ConfigNames: []string{"retention.ms"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Value != fmt.Sprint((2*time.Hour).Milliseconds()) {
			t.Errorf("%s retention.ms = %+v", name, entries)
		}
	}
	// Idempotent.
	if err := forward.EnsureTopics(ctx, admin, topics, 3, pol); err != nil {
		t.Fatalf("second EnsureTopics: %v", err)
	}
	// Fewer than the source: a clear, typed error.
	err := forward.EnsureTopics(ctx, admin, topics, 5, pol)
	var pm *forward.PartitionMismatchError
	if !errors.As(err, &pm) || pm.Found != 3 || pm.Wanted != 5 {
		t.Fatalf("EnsureTopics(5) = %v, want *PartitionMismatchError found 3 wanted 5", err)
	}
	t.Logf("mismatch error: %v", err)
}

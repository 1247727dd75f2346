package forward_test

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/retrytopic"
)

// topicWith creates a topic as k.Topic does (a unique name from prefix,
// deleted with its tiers and DLQ when the test ends), sets configs on it,
// and waits until the broker describes them.
func topicWith(t *testing.T, k *idemtest.Kafka, prefix string, partitions int32, configs map[string]string) string {
	t.Helper()
	name := k.Topic(t, prefix, partitions)
	setConfigs(t, k, name, configs)
	return name
}

// namedTopicWith creates the topic name (its deletion is left to the source
// topic's, whose tier or DLQ it is), sets configs and waits for them.
func namedTopicWith(t *testing.T, k *idemtest.Kafka, name string, partitions int32, configs map[string]string) {
	t.Helper()
	k.CreateTopic(t, name, partitions)
	setConfigs(t, k, name, configs)
}

func setConfigs(t *testing.T, k *idemtest.Kafka, topic string, configs map[string]string) {
	t.Helper()
	admin := newAdmin(t, k)
	entries := map[string]*string{}
	for key, v := range configs {
		entries[key] = &v
	}
	if err := admin.AlterConfig(sarama.TopicResource, topic, entries, false); err != nil {
		t.Fatalf("configure %s: %v", topic, err)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		for key, v := range configs {
			if got := describeConfig(t, admin, topic, key); got != v {
				return fmt.Errorf("%s %s = %s, want %s", topic, key, got, v)
			}
		}
		return nil
	})
}

// describeConfig returns one config of topic.
func describeConfig(t *testing.T, admin sarama.ClusterAdmin, topic, name string) string {
	t.Helper()
	rs, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{name}}}, sarama.DescribeConfigsOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		for _, e := range r.Configs {
			if r.Name == topic && e.Name == name {
				return e.Value
			}
		}
	}
	t.Fatalf("%s of %s not described", name, topic)
	return ""
}

// The tiers and DLQ of a source topic allowing 4 MiB records are created
// with 4 MiB + HeaderHeadroom and the source's segment.bytes; an existing DLQ
// limited to 1 MiB and a tier keeping records shorter than twice its delay
// are warnings naming both numbers, not errors.
func TestEnsureTopicsForCopiesSizeLimits(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	admin := newAdmin(t, k)
	const fourMiB, oneMiB = 4 << 20, 1 << 20
	group := k.Group(t, "g")

	t.Run("created like the source", func(t *testing.T) {
		src := topicWith(t, k, "src", 2, map[string]string{"max.message.bytes": strconv.Itoa(fourMiB), "segment.bytes": strconv.Itoa(2 * fourMiB)})
		pol := retrytopic.Policy{Delays: []time.Duration{time.Second}}
		sz, err := forward.EnsureTopicsFor(ctx, admin, src, group, pol)
		if err != nil {
			t.Fatal(err)
		}
		want := int64(fourMiB + forward.HeaderHeadroom)
		if sz.SourceMaxMessageBytes != fourMiB || sz.MaxMessageBytes != want || len(sz.Warnings) != 0 {
			t.Fatalf("Sizes = %+v, want source %d, max %d, no warnings", sz, fourMiB, want)
		}
		if got := sz.ProducerMaxMessageBytes(); got != int(want)+forward.HeaderHeadroom {
			t.Errorf("ProducerMaxMessageBytes = %d", got)
		}
		for _, name := range pol.Topics(src, group) {
			waitPartitions(t, admin, name, 2)
			if v := describeConfig(t, admin, name, "max.message.bytes"); v != strconv.FormatInt(want, 10) {
				t.Errorf("%s max.message.bytes = %s, want %d", name, v, want)
			}
			if v := describeConfig(t, admin, name, "segment.bytes"); v != strconv.Itoa(2*fourMiB) {
				t.Errorf("%s segment.bytes = %s, want the source's %d", name, v, 2*fourMiB)
			}
		}
		// Idempotent: a second call finds them and reports the same limit.
		again, err := forward.EnsureTopicsFor(ctx, admin, src, group, pol)
		if err != nil || again.MaxMessageBytes != want || len(again.Warnings) != 0 {
			t.Fatalf("second EnsureTopicsFor = %+v, %v", again, err)
		}
	})

	t.Run("existing smaller topics are warnings", func(t *testing.T) {
		src := topicWith(t, k, "src", 1, map[string]string{"max.message.bytes": strconv.Itoa(fourMiB)})
		pol := retrytopic.Policy{Delays: []time.Duration{time.Hour}}
		dlq, tier := pol.DLQ(src, group), pol.Tier(src, group, 1)
		namedTopicWith(t, k, dlq, 1, map[string]string{"max.message.bytes": strconv.Itoa(oneMiB)})
		namedTopicWith(t, k, tier, 1, map[string]string{"retention.ms": strconv.FormatInt(time.Hour.Milliseconds(), 10), "max.message.bytes": strconv.Itoa(2 * fourMiB)})
		sz, err := forward.EnsureTopicsFor(ctx, admin, src, group, pol)
		if err != nil {
			t.Fatal(err)
		}
		if sz.MaxMessageBytes != 2*fourMiB {
			t.Errorf("MaxMessageBytes = %d, want the tier's %d (the largest)", sz.MaxMessageBytes, 2*fourMiB)
		}
		got := map[string]*forward.LimitWarning{}
		for _, w := range sz.Warnings {
			got[w.Topic+" "+w.Config] = w
			t.Logf("warning: %v", w)
		}
		if w := got[dlq+" max.message.bytes"]; w == nil || w.Found != oneMiB || w.Want != fourMiB ||
			!bytes.Contains([]byte(w.Error()), []byte("1048576")) || !bytes.Contains([]byte(w.Error()), []byte("4194304")) {
			t.Errorf("DLQ size warning = %v, want one naming 1048576 and 4194304", w)
		}
		if w := got[tier+" retention.ms"]; w == nil || w.Found != time.Hour.Milliseconds() || w.Want != 2*time.Hour.Milliseconds() {
			t.Errorf("tier retention warning = %v", w)
		}
		if len(sz.Warnings) != 2 {
			t.Errorf("%d warnings, want 2", len(sz.Warnings))
		}
	})

	t.Run("unknown source", func(t *testing.T) {
		_, err := forward.EnsureTopicsFor(ctx, admin, "missing_"+group, group, retrytopic.Policy{})
		if !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			t.Fatalf("EnsureTopicsFor(missing) = %v, want ErrUnknownTopicOrPartition", err)
		}
	})
}

// The broker's and the client's refusals of a record are classified as
// permanent; a deleted topic is not.
func TestForwardRefusalsArePermanent(t *testing.T) {
	k := idemtest.Connect(t)
	ctx := t.Context()
	small := topicWith(t, k, "small", 1, map[string]string{"max.message.bytes": strconv.Itoa(1 << 20)})
	compacted := topicWith(t, k, "compacted", 1, map[string]string{"cleanup.policy": "compact"})

	cfg := k.SaramaConfig()
	retrytopic.ConfigureProducer(cfg)
	cfg.Producer.MaxMessageBytes = 4 << 20
	cfg.Producer.Retry.Max = 1
	cfg.Metadata.Retry.Max = 1
	client, err := sarama.NewClient(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	fwd, err := forward.NewForwarderFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fwd.Close() })

	tests := []struct {
		name      string
		rec       forward.Record
		want      error
		permanent bool
	}{
		{"broker: MESSAGE_TOO_LARGE", forward.Record{Topic: small, Key: []byte("k"), Value: make([]byte, 2<<20)}, sarama.ErrMessageSizeTooLarge, true},
		{"client: above Producer.MaxMessageBytes", forward.Record{Topic: small, Key: []byte("k"), Value: make([]byte, 5<<20)}, sarama.ErrMessageSizeTooLarge, true},
		{"broker: INVALID_RECORD (no key on a compacted topic)", forward.Record{Topic: compacted, Value: []byte("v")}, sarama.ErrInvalidRecord, true},
		{"outage: unknown topic, never auto-created", forward.Record{Topic: "nowhere_" + small, Value: []byte("v")}, sarama.ErrUnknownTopicOrPartition, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fwd.Forward(ctx, tt.rec)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Forward = %v, want %v", err, tt.want)
			}
			if got := forward.IsPermanentForwardError(err); got != tt.permanent {
				t.Fatalf("IsPermanentForwardError(%v) = %v, want %v", err, got, tt.permanent)
			}
		})
	}
	// After the refusals the producer still works on the same partitions.
	if err := fwd.Forward(ctx, forward.Record{Topic: small, Key: []byte("k"), Value: []byte("fine")}); err != nil {
		t.Fatalf("Forward after refusals: %v", err)
	}
	if err := fwd.Forward(ctx, forward.Record{Topic: compacted, Key: []byte("k"), Value: []byte("fine")}); err != nil {
		t.Fatalf("Forward after refusals: %v", err)
	}
	ts, err := newAdmin(t, k).ListTopics()
	if err != nil {
		t.Fatal(err)
	}
	if nowhere := tests[len(tests)-1].rec.Topic; ts[nowhere].NumPartitions != 0 {
		t.Errorf("topic %s was auto-created", nowhere)
	}
}

package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/committedtest"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// seedTransactional writes five dead letters for origin into dlqTopic as a
// consumer with Config.Transactions does, each in a transaction of its own
// (so each is followed by a commit marker), records 0, 2 and 4 to partition
// 0 and 1 and 3 to partition 1; and, between them, one aborted transaction
// on each partition whose records are no dead letters.
func seedTransactional(t *testing.T, k *idemtest.Kafka, dlqTopic, origin string) {
	t.Helper()
	msg := func(i int, p int32) *sarama.ProducerMessage {
		key := fmt.Sprint("pay-", i)
		f := retrytopic.Failure{Attempt: 1, OriginalTopic: origin, OriginalPartition: p, OriginalOffset: int64(i), Group: "billing",
			Kind: handler.KindPermanent, ErrorType: "*errors.errorString", Error: "card declined",
			FirstFailureAt: time.Now(), LastFailureAt: time.Now()}
		return &sarama.ProducerMessage{Topic: dlqTopic, Partition: p, Key: sarama.StringEncoder(key), Value: sarama.StringEncoder(`{"id":"` + key + `"}`),
			Headers: wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}, f)}
	}
	for i := range 5 {
		committedtest.Produce(t, k.Brokers, k.SaramaConfig(), false, msg(i, int32(i%2)))
		if i < 2 {
			committedtest.Produce(t, k.Brokers, k.SaramaConfig(), true, msg(100+i, int32(i%2)), msg(200+i, int32(i%2)))
		}
	}
}

// TestTransactionalDLQ: a dead-letter topic written with transactions holds
// markers and aborted records. Depth counts the five dead letters, not the
// markers; List, Show and Replay read committed records only and return
// (each bounded here by 20 s) instead of waiting for a record at a marker's
// offset; a replay sends the five and leaves nothing pending.
func TestTransactionalDLQ(t *testing.T) {
	k := idemtest.Connect(t)
	topic, origin := k.Topic(t, "dlq", 2), k.Topic(t, "origin", 2)
	seedTransactional(t, k, topic, origin)
	c := open(t, k)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	if n, err := c.Depth(ctx, topic); err != nil || n != 5 {
		t.Errorf("Depth = %d, %v; want 5 (the dead letters, not their markers or aborted records)", n, err)
	}
	parts, err := c.DepthByPartition(ctx, topic)
	if err != nil || len(parts) != 2 || parts[0].Pending != 3 || parts[1].Pending != 2 {
		t.Errorf("DepthByPartition = %+v, %v; want 3 and 2 pending", parts, err)
	}
	groups, err := c.List(ctx, topic)
	if err != nil || len(groups) != 1 || groups[0].Count != 5 {
		t.Fatalf("List = %+v, %v; want one group of 5", groups, err)
	}
	r, err := c.Show(ctx, topic, dlq.Position{Key: "pay-4"})
	if err != nil || string(r.Value) != `{"id":"pay-4"}` {
		t.Errorf("Show(key pay-4) = %+v, %v", r, err)
	}
	if _, err := c.Show(ctx, topic, dlq.Position{Key: "pay-100"}); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Show(key of an aborted record) = %v, want ErrNotFound", err)
	}
	if _, err := c.Show(ctx, topic, dlq.Position{Partition: 0, Offset: 1}); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Show(a marker's offset) = %v, want ErrNotFound", err)
	}
	res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: topic})
	if err != nil || res.Pending != 5 || res.Replayed != 5 || res.Skipped != 0 {
		t.Fatalf("Replay = %+v, %v; want 5 pending, 5 replayed", res, err)
	}
	if got := readAll(t, k, origin); len(got) != 5 {
		t.Errorf("origin holds %d records after the replay, want 5", len(got))
	}
	if n, err := c.Depth(ctx, topic); err != nil || n != 0 {
		t.Errorf("Depth after the replay = %d, %v; want 0", n, err)
	}
}

package txn_test

import (
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/txn"
)

// newOwner makes an owner for group on a client of its own.
func newOwner(t *testing.T, k *testenv.Kafka, group string) *txn.Owner {
	t.Helper()
	client, err := sarama.NewClient(k.Brokers, txn.Config(k.SaramaConfig(), testenv.Unique("txn-test"), 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	o, err := txn.New(client, group, "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// compactedTopic creates a compacted topic of one partition, which refuses
// a keyless record for good (INVALID_RECORD), deleted when the test ends.
func compactedTopic(t *testing.T, k *testenv.Kafka) string {
	t.Helper()
	compacted := testenv.Unique("t_compacted")
	policy := "compact"
	if err := k.Admin(t).CreateTopic(compacted, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"cleanup.policy": &policy}}, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.DeleteTopics(t, compacted) })
	k.WaitTopic(t, compacted, 1)
	return compacted
}

// committedOffset is group's committed offset of topic/0 (-1: none).
func committedOffset(t *testing.T, k *testenv.Kafka, group, topic string) int64 {
	t.Helper()
	resp, err := k.Admin(t).ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if err != nil {
		t.Fatal(err)
	}
	if b := resp.GetBlock(topic, 0); b != nil {
		return b.Offset
	}
	return -1
}

// TestOwnerFailsAndResets: a commit the group coordinator refuses (a
// generation the group never had) aborts the transaction with its record;
// the owner then refuses holds and drops marks until Reset, after which a
// forward and its offset commit together.
func TestOwnerFailsAndResets(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic, group := k.Topic(t, 1), testenv.Group(t)
	o := newOwner(t, k, group)
	var after []map[string]map[int32]int64 // AfterCommit's calls: only commits that committed offsets
	o.AfterCommit = func(c map[string]map[int32]int64) { after = append(after, c) }

	if err := o.Commit(sarama.NewConsumerGroupMetadata(group)); err != nil {
		t.Fatalf("Commit with nothing to commit = %v, want nil", err)
	}

	release, err := o.Hold()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Forward(testenv.Context(t), forward.Record{Topic: topic, Partition: 0, Key: []byte("aborted")}); err != nil {
		t.Fatal(err)
	}
	o.Mark(topic, 0, 7)
	release()
	stale := sarama.NewConsumerGroupMetadata(group)
	stale.GenerationID, stale.MemberID = 5, "gone"
	err = o.Commit(stale)
	if !errors.Is(err, txn.ErrBroken) {
		t.Fatalf("Commit with a generation the group never had = %v, want ErrBroken", err)
	}
	select {
	case <-o.Failed():
	default:
		t.Fatal("Failed is not closed after a failed commit")
	}
	if _, err := o.Hold(); !errors.Is(err, txn.ErrBroken) {
		t.Fatalf("Hold after a failed commit = %v, want ErrBroken", err)
	}
	o.Mark(topic, 0, 9) // dropped

	if err := o.Reset(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-o.Failed():
		t.Fatal("Failed is closed after Reset")
	default:
	}
	if err := o.Commit(sarama.NewConsumerGroupMetadata(group)); err != nil {
		t.Fatalf("Commit after Reset with nothing marked = %v, want nil (the failed session's marks are dropped)", err)
	}
	if got := committedOffset(t, k, group, topic); got != -1 {
		t.Fatalf("committed offset %d after the failed transaction, want none", got)
	}
	release, err = o.Hold()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Forward(testenv.Context(t), forward.Record{Topic: topic, Partition: 0, Key: []byte("committed")}); err != nil {
		t.Fatal(err)
	}
	o.Mark(topic, 0, 3)
	release()
	// A group with no members takes offsets without a generation (a simple
	// group), as the outbox relay's progress mark does.
	if err := o.Commit(sarama.NewConsumerGroupMetadata(group)); err != nil {
		t.Fatal(err)
	}
	if got := committedOffset(t, k, group, topic); got != 3 {
		t.Fatalf("committed offset %d, want 3", got)
	}
	if len(after) != 1 || len(after[0]) != 1 || after[0][topic][0] != 3 {
		t.Fatalf("AfterCommit ran with %v, want once with %s/0 at 3 (not for the failed or empty commits)", after, topic)
	}

	// A read_committed reader sees only the committed record.
	cfg := k.SaramaConfig()
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	c, err := sarama.NewConsumer(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, 0, sarama.OffsetOldest)
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	select {
	case m := <-pc.Messages():
		if string(m.Key) != "committed" {
			t.Fatalf("read_committed reader got %q first, want the committed record", m.Key)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("read_committed reader got nothing within 30 s")
	}
}

// TestOwnerRefusedRecord: a record the broker refuses for good (a keyless
// record for a compacted topic: INVALID_RECORD) aborts the transaction; the
// Forward that sent it returns a *RefusedError naming the destination and
// the refusal, which wraps ErrBroken too, and a record forwarded earlier in
// the same transaction is aborted with it. After Reset the owner works.
func TestOwnerRefusedRecord(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic, group := k.Topic(t, 1), testenv.Group(t)
	compacted := compactedTopic(t, k)
	o := newOwner(t, k, group)

	release, err := o.Hold()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Forward(testenv.Context(t), forward.Record{Topic: topic, Partition: 0, Key: []byte("aborted")}); err != nil {
		t.Fatal(err)
	}
	err = o.Forward(testenv.Context(t), forward.Record{Topic: compacted, Partition: 0, Value: []byte("keyless")})
	release()
	var refused *txn.RefusedError
	if !errors.As(err, &refused) || refused.Topic != compacted || !errors.Is(err, sarama.ErrInvalidRecord) || !errors.Is(err, txn.ErrBroken) {
		t.Fatalf("Forward of a keyless record to a compacted topic = %v, want a *RefusedError wrapping INVALID_RECORD and ErrBroken", err)
	}
	select {
	case <-o.Failed():
	default:
		t.Fatal("Failed is not closed after a refused record")
	}
	if err := o.Reset(); err != nil {
		t.Fatal(err)
	}
	release, err = o.Hold()
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Forward(testenv.Context(t), forward.Record{Topic: compacted, Partition: 0, Key: []byte("k"), Value: []byte("keyed")}); err != nil {
		t.Fatalf("Forward after Reset = %v", err)
	}
	o.Mark(topic, 0, 1)
	release()
	if err := o.Commit(sarama.NewConsumerGroupMetadata(group)); err != nil {
		t.Fatal(err)
	}
	if got := committedOffset(t, k, group, topic); got != 1 {
		t.Fatalf("committed offset %d, want 1", got)
	}
}

// TestOwnerAbortsOnlyWhenNoForwardHolds: a forward the broker refuses while
// another forward still holds the owner (another lane, between its send and
// its mark) breaks the owner at once (Failed closed, Hold refused, marks
// dropped) but does not abort the transaction: sarama's abort would race the
// other forward's sends on the same producer. The transaction stays in its
// abortable error until Reset, which waits for the holds to end, aborts it,
// and leaves the producer ready for the next session.
func TestOwnerAbortsOnlyWhenNoForwardHolds(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	topic, group := k.Topic(t, 1), testenv.Group(t)
	compacted := compactedTopic(t, k)
	o := newOwner(t, k, group)

	hold, err := o.Hold() // the other lane: sent, not yet marked
	if err != nil {
		t.Fatal(err)
	}
	releaseOther := sync.OnceFunc(hold)
	t.Cleanup(releaseOther) // before o.Close, which waits for every hold
	if err := o.Forward(testenv.Context(t), forward.Record{Topic: topic, Partition: 0, Key: []byte("other lane")}); err != nil {
		t.Fatal(err)
	}
	release, err := o.Hold()
	if err != nil {
		t.Fatal(err)
	}
	err = o.Forward(testenv.Context(t), forward.Record{Topic: compacted, Partition: 0, Value: []byte("keyless")})
	release()
	var refused *txn.RefusedError
	if !errors.As(err, &refused) || !errors.Is(err, txn.ErrBroken) {
		t.Fatalf("Forward of a keyless record to a compacted topic = %v, want a *RefusedError wrapping ErrBroken", err)
	}
	select {
	case <-o.Failed():
	default:
		t.Fatal("Failed is not closed after a refused record")
	}
	if _, err := o.Hold(); !errors.Is(err, txn.ErrBroken) {
		t.Fatalf("Hold after the refusal = %v, want ErrBroken", err)
	}
	if st := o.TxnStatus(); st&sarama.ProducerTxnFlagAbortableError == 0 {
		t.Fatalf("transaction status %s while another forward holds the owner, want it still in its abortable error (not aborted)", st)
	}
	o.Mark(topic, 0, 1) // the other lane's mark: dropped
	releaseOther()

	if err := o.Reset(); err != nil {
		t.Fatal(err)
	}
	if st := o.TxnStatus(); st != sarama.ProducerTxnFlagReady {
		t.Fatalf("transaction status %s after Reset, want ready (aborted)", st)
	}
	if err := o.Commit(sarama.NewConsumerGroupMetadata(group)); err != nil {
		t.Fatalf("Commit after Reset with nothing marked = %v, want nil (the failed session's marks are dropped)", err)
	}
	if got := committedOffset(t, k, group, topic); got != -1 {
		t.Fatalf("committed offset %d after the refused transaction, want none", got)
	}
}

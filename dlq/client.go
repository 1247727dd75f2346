package dlq

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/committed"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/retrytopic"
)

// AdminGroup returns the consumer group whose committed offsets mark how far
// operators have dealt with dlqTopic: "<dlq-topic>.admin". Records at or after
// its committed offset are pending; List, Replay, Purge and Depth work on them.
// Nothing ever joins this group; idem commits its offsets directly.
func AdminGroup(dlqTopic string) string { return dlqTopic + ".admin" }

// ErrNotFound is returned by Show when no record matches.
var ErrNotFound = errors.New("dlq: record not found")

// ErrUnknownTopic is wrapped by every call given a topic the cluster does not
// have (or a name that is not a valid topic name), and by Replay when a
// destination does not exist. No call of this package ever creates a topic.
var ErrUnknownTopic = errors.New("dlq: unknown topic")

// Client inspects, replays and purges dead-letter topics. It is safe for
// concurrent use, but two Replays or a Replay and a Purge of the same topic
// at once would both work from the same committed offset: run one at a time
// per topic.
type Client struct {
	client sarama.Client
	owned  bool

	mu     sync.Mutex
	fwd    *forward.Forwarder
	counts map[string]counted // Depth's last count per "topic/partition"
}

// Open connects to brokers. cfg may be nil (sarama defaults with Version
// V4_0_0_0); it is copied, and the copy is set up for replay as
// retrytopic.ConfigureProducer describes (idempotent, acks=all), with
// Metadata.AllowAutoTopicCreation = false (a metadata request or a send never
// creates a topic, whatever the broker's auto.create.topics.enable says).
// Records are read as a read_committed consumer reads them, whatever
// Consumer.IsolationLevel says (see Depth). Close the Client when done.
func Open(brokers []string, cfg *sarama.Config) (*Client, error) {
	var c sarama.Config
	if cfg == nil {
		c = *sarama.NewConfig()
		c.Version = sarama.V4_0_0_0
	} else {
		c = *cfg
	}
	retrytopic.ConfigureProducer(&c)
	c.Metadata.AllowAutoTopicCreation = false
	client, err := sarama.NewClient(brokers, &c)
	if err != nil {
		return nil, fmt.Errorf("dlq: connect to %s: %w", strings.Join(brokers, ","), err)
	}
	return &Client{client: client, owned: true}, nil
}

// New returns a Client on client, which the caller keeps owning (Close does
// not close it). For Replay, client's config must be set up as
// retrytopic.ConfigureProducer describes, and should have
// Metadata.AllowAutoTopicCreation = false: the Client itself checks every topic
// with metadata requests that never create it, but a producer on a client
// that allows creation could still create a topic deleted in the meantime.
func New(client sarama.Client) *Client { return &Client{client: client} }

// Close releases the producer Replay created and, for a Client from Open, the
// connection. It is safe to call more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	fwd, owned := c.fwd, c.owned
	c.fwd, c.owned = nil, false
	c.mu.Unlock()
	var errs []error
	if fwd != nil {
		errs = append(errs, fwd.Close())
	}
	if owned {
		errs = append(errs, c.client.Close())
	}
	return errors.Join(errs...)
}

func (c *Client) forwarder() (*forward.Forwarder, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fwd == nil {
		f, err := forward.NewForwarderFromClient(c.client)
		if err != nil {
			return nil, err
		}
		c.fwd = f
	}
	return c.fwd, nil
}

// span is one partition's pending range [Start, End).
type span struct {
	Partition  int32
	Start, End int64
	Committed  int64 // the admin group's committed offset, -1 if none
}

// pending returns, per partition in order, the range from the admin group's
// committed offset (or the earliest retained offset, whichever is later) to
// the last stable offset now (committed.End: the end offset, unless a
// transaction is open; its records are not dead letters yet).
func (c *Client) pending(ctx context.Context, topic string) ([]span, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	parts, err := c.partitions(topic)
	if err != nil {
		return nil, err
	}
	offsets, err := c.committed(topic, parts)
	if err != nil {
		return nil, err
	}
	spans := make([]span, 0, len(parts))
	for _, p := range parts {
		oldest, err := c.client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, fmt.Errorf("dlq: earliest offset of %s/%d: %w", topic, p, err)
		}
		newest, err := committed.End(c.client, topic, p)
		if err != nil {
			return nil, fmt.Errorf("dlq: end offset of %s/%d: %w", topic, p, err)
		}
		s := span{Partition: p, Start: oldest, End: newest, Committed: offsets[p]}
		if s.Committed > s.Start {
			s.Start = s.Committed
		}
		if s.Start > s.End {
			s.Start = s.End
		}
		spans = append(spans, s)
	}
	return spans, nil
}

func (c *Client) partitions(topic string) ([]int32, error) {
	if err := c.checkTopic(topic); err != nil {
		return nil, err
	}
	if err := c.client.RefreshMetadata(topic); err != nil {
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			return nil, fmt.Errorf("%w %s", ErrUnknownTopic, topic)
		}
		return nil, fmt.Errorf("dlq: metadata of %s: %w", topic, err)
	}
	parts, err := c.client.Partitions(topic)
	if err != nil {
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			return nil, fmt.Errorf("%w %s", ErrUnknownTopic, topic)
		}
		return nil, fmt.Errorf("dlq: partitions of %s: %w", topic, err)
	}
	parts = append([]int32(nil), parts...)
	sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
	return parts, nil
}

// CheckTopic returns nil when topic exists, and an error wrapping
// ErrUnknownTopic when it does not (or its name is not a valid topic name).
// It asks a broker with a metadata request that never creates the topic.
func (c *Client) CheckTopic(topic string) error { return c.checkTopic(topic) }

// checkTopic returns nil when topic exists, and an error wrapping
// ErrUnknownTopic when it does not (or its name is not a valid topic name).
// It asks a broker with a metadata request that never creates the topic,
// whatever the client's Metadata.AllowAutoTopicCreation says.
func (c *Client) checkTopic(topic string) error {
	if topic == "" {
		return errors.New("dlq: no topic given")
	}
	b := c.client.LeastLoadedBroker()
	if b == nil {
		return fmt.Errorf("dlq: metadata of %q: %w", topic, sarama.ErrClosedClient)
	}
	req := sarama.NewMetadataRequest(c.client.Config().Version, []string{topic})
	req.AllowAutoTopicCreation = false
	resp, err := b.GetMetadata(req)
	if err != nil {
		return fmt.Errorf("dlq: metadata of %q from %s: %w", topic, b.Addr(), err)
	}
	for _, t := range resp.Topics {
		if t.Name != topic {
			continue
		}
		switch {
		case errors.Is(t.Err, sarama.ErrNoError):
			return nil
		case errors.Is(t.Err, sarama.ErrUnknownTopicOrPartition), errors.Is(t.Err, sarama.ErrInvalidTopic):
			return fmt.Errorf("%w %q: %w", ErrUnknownTopic, topic, t.Err)
		default:
			return fmt.Errorf("dlq: metadata of %q: %w", topic, t.Err)
		}
	}
	return fmt.Errorf("%w %q: not in the broker's metadata", ErrUnknownTopic, topic)
}

// committed returns the admin group's committed offset per partition (-1 when
// none).
func (c *Client) committed(topic string, parts []int32) (map[int32]int64, error) {
	group := AdminGroup(topic)
	req := sarama.NewOffsetFetchRequest(c.client.Config().Version, group, map[string][]int32{topic: parts})
	var resp *sarama.OffsetFetchResponse
	err := c.withCoordinator(group, func(b *sarama.Broker) error {
		r, err := b.FetchOffset(req)
		if err != nil {
			return err
		}
		if gerr := r.GroupError(); !errors.Is(gerr, sarama.ErrNoError) {
			return gerr
		}
		resp = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dlq: committed offsets of group %s: %w", group, err)
	}
	out := make(map[int32]int64, len(parts))
	for _, p := range parts {
		out[p] = -1
		if b := resp.GetBlock(topic, p); b != nil {
			if !errors.Is(b.Err, sarama.ErrNoError) {
				return nil, fmt.Errorf("dlq: committed offset of group %s on %s/%d: %w", group, topic, p, b.Err)
			}
			out[p] = b.Offset
		}
	}
	return out, nil
}

// commit sets the admin group's committed offsets of topic. It commits as a
// group without members (generation -1), which Kafka accepts while nobody has
// joined the group.
func (c *Client) commit(topic string, offsets map[int32]int64) error {
	if len(offsets) == 0 {
		return nil
	}
	group := AdminGroup(topic)
	v := c.client.Config().Version
	req := &sarama.OffsetCommitRequest{ConsumerGroup: group, ConsumerGroupGeneration: -1, Version: 2, RetentionTime: -1}
	switch {
	case v.IsAtLeast(sarama.V2_4_0_0):
		req.Version = 8
	case v.IsAtLeast(sarama.V2_3_0_0):
		req.Version = 7
	case v.IsAtLeast(sarama.V2_1_0_0):
		req.Version = 6
	case v.IsAtLeast(sarama.V2_0_0_0):
		req.Version = 4
	case v.IsAtLeast(sarama.V0_11_0_0):
		req.Version = 3
	}
	for p, o := range offsets {
		req.AddBlockWithLeaderEpoch(topic, p, o, -1, 0, "")
	}
	err := c.withCoordinator(group, func(b *sarama.Broker) error {
		resp, err := b.CommitOffset(req)
		if err != nil {
			return err
		}
		for _, ps := range resp.Errors {
			for p, kerr := range ps {
				if !errors.Is(kerr, sarama.ErrNoError) {
					return fmt.Errorf("partition %d: %w", p, kerr)
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("dlq: commit offsets of group %s on %s: %w", group, topic, err)
	}
	return nil
}

// withCoordinator runs f against group's coordinator, refreshing it and
// trying again (up to 3 times) when it moved.
func (c *Client) withCoordinator(group string, f func(*sarama.Broker) error) error {
	var err error
	for range 3 {
		var b *sarama.Broker
		b, err = c.client.Coordinator(group)
		if err == nil {
			err = f(b)
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, sarama.ErrNotCoordinatorForConsumer) && !errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable) &&
			!errors.Is(err, sarama.ErrOffsetsLoadInProgress) {
			return err
		}
		_ = c.client.RefreshCoordinator(group)
	}
	return err
}

// Depth returns how many records of topic are pending: the dead letters
// from the admin group's committed offset (or the earliest retained offset
// when nothing was committed or the committed records were deleted by
// retention) to the end, as a read_committed consumer reads them. In a
// topic written with transactions the offsets also hold commit markers and
// aborted records, which are not counted, so the records are read; the
// Client remembers each partition's count and later reads only what was
// added since (or what the admin group moved past).
func (c *Client) Depth(ctx context.Context, topic string) (int64, error) {
	parts, err := c.DepthByPartition(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, p := range parts {
		n += p.Pending
	}
	return n, nil
}

// counted is what Depth last counted in one partition: Count records in
// [Start, End).
type counted struct {
	Start, End, Count int64
}

// count returns the number of dead letters of topic in s, reading only what
// differs from the last count of the same partition.
func (c *Client) count(ctx context.Context, topic string, s span) (int64, error) {
	if s.Start >= s.End {
		return 0, nil
	}
	key := fmt.Sprintf("%s/%d", topic, s.Partition)
	c.mu.Lock()
	last, ok := c.counts[key]
	c.mu.Unlock()
	n := func(from, to int64) (int64, error) {
		return committed.Count(ctx, c.client, topic, s.Partition, from, to, readWait)
	}
	var total int64
	var err error
	switch {
	case ok && last.Start <= s.Start && s.Start <= last.End && last.End <= s.End:
		// The same records, less those the admin group moved past, plus those added.
		var gone, added int64
		if gone, err = n(last.Start, s.Start); err == nil {
			if added, err = n(last.End, s.End); err == nil {
				total = last.Count - gone + added
			}
		}
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return 0, err
		}
		fallthrough // retention deleted what was counted: count again
	default:
		if total, err = n(s.Start, s.End); err != nil {
			return 0, fmt.Errorf("dlq: count %s/%d: %w", topic, s.Partition, err)
		}
	}
	c.mu.Lock()
	if c.counts == nil {
		c.counts = map[string]counted{}
	}
	c.counts[key] = counted{Start: s.Start, End: s.End, Count: total}
	c.mu.Unlock()
	return total, nil
}

// Advance moves the admin group of topic forward: for each partition in
// offsets, to that offset when it is past the group's committed offset
// (never back). Records below the admin group's offset are no longer
// pending: Depth (and so idem_dlq_depth), List and Replay leave them out.
// The failure index's indexer calls it so that records settled in the
// index (replayed, resolved, archived) stop counting as pending up to the
// first one that is not.
func (c *Client) Advance(ctx context.Context, topic string, offsets map[int32]int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	parts := make([]int32, 0, len(offsets))
	for p := range offsets {
		parts = append(parts, p)
	}
	committed, err := c.committed(topic, parts)
	if err != nil {
		return err
	}
	forward := map[int32]int64{}
	for p, o := range offsets {
		if o > committed[p] {
			forward[p] = o
		}
	}
	return c.commit(topic, forward)
}

// Purge marks every record of topic that is in it now as dealt with: it
// commits the admin group at the end offsets, so Depth is 0 and List and
// Replay see nothing of it. Records stay in the topic until retention deletes
// them (Show still finds them). It returns how many records were pending
// (dead letters, as Depth counts them).
func (c *Client) Purge(ctx context.Context, topic string) (int64, error) {
	spans, err := c.pending(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	offsets := map[int32]int64{}
	for _, s := range spans {
		k, err := c.count(ctx, topic, s)
		if err != nil {
			return 0, err
		}
		n += k
		if s.Committed != s.End {
			offsets[s.Partition] = s.End
		}
	}
	if err := c.commit(topic, offsets); err != nil {
		return 0, err
	}
	return n, nil
}

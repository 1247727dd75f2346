// Package committed is a reader of Kafka partitions as a read_committed
// consumer sees them, which knows where it stands while it reads.
//
// A topic written with transactions (consumer.Config.Transactions, the
// outbox relay's ExactlyOnce) holds, after the records of each
// transaction, a control record (a commit or abort marker) that takes an
// offset but is never delivered, and it may hold the records of aborted
// transactions, which a read_committed consumer never delivers either. So a
// partition's end offset is not a count of its records, and a reader that
// waits for a record at the last offset before the end waits for ever when
// that offset is a marker. sarama's consumer does not say where it stands
// after skipping markers, so the readers of dead-letter topics and retry
// tiers (package dlq, idemtest.ReadDLQ, the failure index) read through
// this package instead: End gives the last stable offset, the end of what
// is decided, and Read fetches directly up to an offset, skipping markers
// and aborted records, with every wait bounded.
package committed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

// ErrStuck is wrapped by Read's error when the partition did not move past
// an offset within the wait Read was given: an open transaction holds the
// last stable offset back, or the leader does not answer.
var ErrStuck = errors.New("committed: partition did not move")

// ErrGone is wrapped by Read's error when the range starts below the
// partition's log start offset: retention deleted those records.
var ErrGone = errors.New("committed: records deleted by retention")

// End returns the last stable offset of topic/partition: every record
// below it is committed or aborted, or written without a transaction; the
// records at and after it belong to transactions still open. Without
// transactions it is the high-water mark. It asks the partition's leader
// (ListOffsets with isolation READ_COMMITTED).
func End(client sarama.Client, topic string, partition int32) (int64, error) {
	v := client.Config().Version
	if !v.IsAtLeast(sarama.V0_11_0_0) {
		return 0, fmt.Errorf("committed: Kafka version %s has no transactions: want 0.11 or newer", v)
	}
	var last error
	for attempt := range 3 {
		if attempt > 0 {
			_ = client.RefreshMetadata(topic)
		}
		leader, err := client.Leader(topic, partition)
		if err != nil {
			last = err
			continue
		}
		req := sarama.NewOffsetRequest(v)
		req.IsolationLevel = sarama.ReadCommitted
		req.AddBlock(topic, partition, sarama.OffsetNewest, 1)
		resp, err := leader.GetAvailableOffsets(req)
		if err != nil {
			last = err
			continue
		}
		b := resp.GetBlock(topic, partition)
		switch {
		case b == nil:
			last = sarama.ErrIncompleteResponse
		case !errors.Is(b.Err, sarama.ErrNoError):
			last = b.Err
		case b.Offset >= 0:
			return b.Offset, nil
		case len(b.Offsets) == 1:
			return b.Offsets[0], nil
		default:
			last = sarama.ErrIncompleteResponse
		}
	}
	return 0, fmt.Errorf("committed: last stable offset of %s/%d: %w", topic, partition, last)
}

// Read calls fn, in offset order, for each record of topic/partition in
// [from, end) that a read_committed consumer gets: control records and the
// records of aborted transactions are skipped. It fetches directly from the
// partition's leader. It returns nil once it has passed end-1, fn's error
// as soon as fn returns one, ctx's error when ctx ends, an error wrapping
// ErrGone when from is below the log start offset, and an error wrapping
// ErrStuck when the partition does not move for wait (an open transaction
// below end, a leader that does not answer). Give an end no later than
// End's, and it never waits on an open transaction.
//
// The messages fn gets carry Topic, Partition, Offset, Key, Value, Headers
// and Timestamp; fn must not keep them past its return.
func Read(ctx context.Context, client sarama.Client, topic string, partition int32, from, end int64, wait time.Duration,
	fn func(*sarama.ConsumerMessage) error) error {
	req, err := newFetch(client.Config().Version)
	if err != nil {
		return err
	}
	aborted := map[int64]bool{} // producers whose aborted transaction spans the current offset
	deadline := time.Now().Add(wait)
	for off := from; off < end; {
		if err := ctx.Err(); err != nil {
			return err
		}
		next, err := fetchOnce(client, req, topic, partition, off, end, readBytes, aborted, fn)
		switch {
		case errors.Is(err, errRetry):
			_ = client.RefreshMetadata(topic)
		case err != nil:
			return err
		case next > off:
			off = next
			deadline = time.Now().Add(wait)
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s/%d stayed at offset %d of %d for %s (a transaction open below %d?)", ErrStuck, topic, partition, off, end, wait, end)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Count returns how many records Read would give fn for the same range.
func Count(ctx context.Context, client sarama.Client, topic string, partition int32, from, end int64, wait time.Duration) (int64, error) {
	var n int64
	err := Read(ctx, client, topic, partition, from, end, wait, func(*sarama.ConsumerMessage) error {
		n++
		return nil
	})
	return n, err
}

// First returns the first record a read_committed consumer gets in
// [off, end) of topic/partition, nil when there is none now (the range
// holds only markers and aborted records, or records of a transaction
// still open). It never waits: it fetches a batch at a time (the broker
// returns one whole batch however small the size asked), at most a few
// times, so it costs a few small requests whatever the partition holds.
// The message carries what Read's do; it is the caller's to keep.
func First(client sarama.Client, topic string, partition int32, off, end int64) (*sarama.ConsumerMessage, error) {
	req, err := newFetch(client.Config().Version)
	if err != nil {
		return nil, err
	}
	var first *sarama.ConsumerMessage
	found := func(m *sarama.ConsumerMessage) error {
		first = m
		return errFound
	}
	aborted := map[int64]bool{}
	for try := 0; try < 8 && off < end; try++ {
		next, err := fetchOnce(client, req, topic, partition, off, end, 1, aborted, found)
		switch {
		case errors.Is(err, errFound):
			return first, nil
		case errors.Is(err, errRetry):
			_ = client.RefreshMetadata(topic)
			continue
		case err != nil:
			return nil, err
		case next <= off:
			return nil, nil // nothing decided past off yet
		}
		off = next
	}
	return nil, nil
}

// errFound stops First's fetch at its first record.
var errFound = errors.New("committed: found")

// readBytes is the most bytes of a partition Read asks for at a time.
const readBytes = 4 << 20

// errRetry is fetchOnce's answer to an error that a metadata refresh may cure.
var errRetry = errors.New("committed: retry")

// newFetch returns the fetch request template for a client of version v.
func newFetch(v sarama.KafkaVersion) (*sarama.FetchRequest, error) {
	req := &sarama.FetchRequest{MaxWaitTime: 100, MinBytes: 1, MaxBytes: 8 << 20, Isolation: sarama.ReadCommitted}
	switch {
	case v.IsAtLeast(sarama.V2_3_0_0):
		req.Version = 11
	case v.IsAtLeast(sarama.V0_11_0_0):
		req.Version = 5
	default:
		return nil, fmt.Errorf("committed: Kafka version %s cannot read committed: want 0.11 or newer", v)
	}
	if req.Version >= 7 {
		req.SessionID, req.SessionEpoch = 0, -1 // no fetch session
	}
	return req, nil
}

// fetchOnce fetches topic/partition from off, up to maxBytes of it (at
// least one batch), and calls fn for the records below end a
// read_committed consumer gets. It returns the offset after the last batch
// it went through (off when it went through none).
func fetchOnce(client sarama.Client, tmpl *sarama.FetchRequest, topic string, partition int32, off, end int64, maxBytes int32,
	aborted map[int64]bool, fn func(*sarama.ConsumerMessage) error) (int64, error) {
	leader, err := client.Leader(topic, partition)
	if err != nil {
		return off, errRetry
	}
	req := *tmpl
	req.AddBlock(topic, partition, off, maxBytes, -1)
	resp, err := leader.Fetch(&req)
	if err != nil {
		return off, errRetry
	}
	b := resp.GetBlock(topic, partition)
	switch {
	case b == nil:
		return off, errRetry
	case errors.Is(b.Err, sarama.ErrOffsetOutOfRange):
		return off, fmt.Errorf("%w: %s/%d offset %d: %w", ErrGone, topic, partition, off, b.Err)
	case errors.Is(b.Err, sarama.ErrNotLeaderForPartition), errors.Is(b.Err, sarama.ErrLeaderNotAvailable),
		errors.Is(b.Err, sarama.ErrUnknownTopicOrPartition), errors.Is(b.Err, sarama.ErrFencedLeaderEpoch),
		errors.Is(b.Err, sarama.ErrUnknownLeaderEpoch), errors.Is(b.Err, sarama.ErrReplicaNotAvailable):
		return off, errRetry
	case !errors.Is(b.Err, sarama.ErrNoError):
		return off, fmt.Errorf("committed: fetch %s/%d at %d: %w", topic, partition, off, b.Err)
	}
	pending := slices.Clone(b.AbortedTransactions)
	slices.SortFunc(pending, func(x, y *sarama.AbortedTransaction) int {
		switch {
		case x.FirstOffset < y.FirstOffset:
			return -1
		case x.FirstOffset > y.FirstOffset:
			return 1
		}
		return 0
	})
	next := off
	for _, rs := range b.RecordsSet {
		if rs.MsgSet != nil { // the pre-0.11 format: no transactions
			for _, mb := range rs.MsgSet.Messages {
				for _, m := range mb.Messages() {
					if m.Offset < next || m.Offset >= end {
						continue
					}
					cm := &sarama.ConsumerMessage{Topic: topic, Partition: partition, Offset: m.Offset, Key: m.Msg.Key,
						Value: m.Msg.Value, Timestamp: m.Msg.Timestamp}
					if err := fn(cm); err != nil {
						return next, err
					}
					next = m.Offset + 1
				}
			}
			continue
		}
		rb := rs.RecordBatch
		if rb == nil || rb.PartialTrailingRecord && len(rb.Records) == 0 {
			continue
		}
		last := rb.FirstOffset + int64(rb.LastOffsetDelta)
		if last < next {
			continue
		}
		for len(pending) > 0 && pending[0].FirstOffset <= last {
			aborted[pending[0].ProducerID] = true
			pending = pending[1:]
		}
		switch {
		case rb.Control: // a marker ends its producer's transaction
			delete(aborted, rb.ProducerID)
		case rb.IsTransactional && aborted[rb.ProducerID]:
		default:
			for _, r := range rb.Records {
				o := rb.FirstOffset + r.OffsetDelta
				if o < next || o >= end {
					continue
				}
				ts := rb.FirstTimestamp.Add(r.TimestampDelta)
				if rb.LogAppendTime {
					ts = rb.MaxTimestamp
				}
				cm := &sarama.ConsumerMessage{Topic: topic, Partition: partition, Offset: o, Key: r.Key, Value: r.Value,
					Headers: r.Headers, Timestamp: ts, BlockTimestamp: rb.MaxTimestamp}
				if err := fn(cm); err != nil {
					return next, err
				}
			}
		}
		if rb.PartialTrailingRecord {
			// The batch was cut at MaxBytes: resume after its last whole record.
			if n := len(rb.Records); n > 0 {
				next = max(next, rb.FirstOffset+rb.Records[n-1].OffsetDelta+1)
			}
			break
		}
		next = last + 1
	}
	return next, nil
}

// Package forward is the sender of records to retry tiers, dead-letter topics and, on
// replay, original topics (Forwarder), durably and never duplicated by
// producer retries (with a producer set up by retrytopic.ConfigureProducer),
// and waits for a tier record's due time (WaitDue). Producer errors are
// classified by IsPermanentForwardError. What a replay sends for a dead
// letter, and to which topics it may go, is decided here too (Replay,
// CheckReplayTarget), for dlq's replay and the failure console's alike.
//
// It also creates the tier and dead-letter topics a retrytopic.Policy names
// (EnsureTopics, EnsureTopicsFor), sized for the source topic's records plus
// idem's headers (HeaderHeadroom, Sizes, LimitWarning), and retries an admin
// request no broker answered (IsUnreachable).
//
// Only idem's own packages use it: the consumer, dlq's replay, the
// scheduler, transactions, the chaos harness and the CLI.
package forward

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Record is one record to forward.
type Record struct {
	// Topic is the destination: a retry tier, the dead-letter topic, or (on
	// replay) the original topic.
	Topic string
	// Partition is the partition the record was read from. It is used again in
	// Topic when Topic has more partitions than that; otherwise the partition
	// is chosen by hashing Key (as sarama's hash partitioner does), or, for a
	// nil Key, Partition modulo the partition count.
	Partition int32
	// Key and Value are sent byte for byte; nil stays nil (a tombstone stays a
	// tombstone) and an empty slice stays empty.
	Key, Value []byte
	// Headers are sent as they are, in order (internal/wire.Encode builds them).
	Headers []sarama.RecordHeader
	// Timestamp of the new record. Default: zero, the producer's clock at send.
	Timestamp time.Time
}

// ForwardError is returned by Forward when the record was not acknowledged.
// The caller must not mark the source offset: nothing was forwarded durably.
type ForwardError struct {
	Topic     string // destination topic
	Partition int32  // destination partition, -1 when none was chosen yet
	Err       error
}

// Error describes the failure in one line.
func (e *ForwardError) Error() string {
	if e.Partition < 0 {
		return fmt.Sprintf("retrytopic: forward to %s: %v", e.Topic, e.Err)
	}
	return fmt.Sprintf("retrytopic: forward to %s/%d: %v", e.Topic, e.Partition, e.Err)
}

// Unwrap returns the producer's or the metadata lookup's error.
func (e *ForwardError) Unwrap() error { return e.Err }

// Forwarder sends records to retry tiers, dead-letter topics and, on replay,
// original topics, keeping the source partition number when the destination
// has it, so per-key ordering and locality hold. It is safe for concurrent
// use. It owns no goroutine; Close closes only a producer it created itself.
type Forwarder struct {
	producer sarama.SyncProducer
	client   sarama.Client
	owned    bool

	mu     sync.Mutex
	hashes map[string]sarama.Partitioner
}

// NewForwarder returns a Forwarder sending through p and reading partition
// counts from client's metadata cache (refreshed every
// Metadata.RefreshFrequency and whenever a topic is unknown). p must be
// configured as retrytopic.ConfigureProducer says (manual partitioner, idempotent,
// acks=all); build it with sarama.NewSyncProducerFromClient(client) so both
// see the same metadata. The caller keeps ownership of p and client.
func NewForwarder(p sarama.SyncProducer, client sarama.Client) *Forwarder {
	return &Forwarder{producer: p, client: client, hashes: map[string]sarama.Partitioner{}}
}

// NewForwarderFromClient creates a sync producer on client and returns a
// Forwarder that owns it (Close closes it, not the client). client's config
// must satisfy retrytopic.ConfigureProducer.
func NewForwarderFromClient(client sarama.Client) (*Forwarder, error) {
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("retrytopic: producer: %w", err)
	}
	f := NewForwarder(p, client)
	f.owned = true
	return f, nil
}

// Close closes the producer when the Forwarder created it; otherwise it does
// nothing. It is safe to call more than once.
func (f *Forwarder) Close() error {
	f.mu.Lock()
	owned, p := f.owned, f.producer
	f.owned = false
	f.mu.Unlock()
	if owned {
		return p.Close()
	}
	return nil
}

// Forward sends rec and waits for the broker's acknowledgement (acks=all).
// It returns nil only when the record is durably written; otherwise a
// *ForwardError, and the caller must not mark the source offset. ctx is
// checked before the send; the send itself is bounded by the producer's
// timeouts (Producer.Timeout, Net.*Timeout, Producer.Retry).
//
// A record larger than the client's Producer.MaxMessageBytes is refused
// before it is sent, with a *ForwardError wrapping
// sarama.ErrMessageSizeTooLarge. IsPermanentForwardError tells a
// refusal that no retry can change (too large, not authorised, invalid) from
// an outage.
func (f *Forwarder) Forward(ctx context.Context, rec Record) error {
	if err := ctx.Err(); err != nil {
		return &ForwardError{Topic: rec.Topic, Partition: -1, Err: err}
	}
	part, err := f.partition(rec)
	if err != nil {
		return &ForwardError{Topic: rec.Topic, Partition: -1, Err: err}
	}
	msg := &sarama.ProducerMessage{
		Topic:     rec.Topic,
		Partition: part,
		Headers:   rec.Headers,
		Timestamp: rec.Timestamp,
	}
	if rec.Key != nil {
		msg.Key = sarama.ByteEncoder(rec.Key)
	}
	if rec.Value != nil {
		msg.Value = sarama.ByteEncoder(rec.Value)
	}
	if err := fits(msg, f.client.Config().Producer.MaxMessageBytes); err != nil {
		return &ForwardError{Topic: rec.Topic, Partition: part, Err: err}
	}
	if _, _, err := f.producer.SendMessage(msg); err != nil {
		return &ForwardError{Topic: rec.Topic, Partition: part, Err: err}
	}
	return nil
}

// Fits returns the error Forward refuses rec with before sending it when
// the producer's Producer.MaxMessageBytes is limit (0: no limit): a
// *ForwardError wrapping sarama.ErrMessageSizeTooLarge for a record larger
// than limit, else nil. The transactional consumer plans a forward's form
// with it, so the form it sends is known before the send.
func Fits(rec Record, limit int) error {
	msg := &sarama.ProducerMessage{Topic: rec.Topic, Headers: rec.Headers, Timestamp: rec.Timestamp}
	if rec.Key != nil {
		msg.Key = sarama.ByteEncoder(rec.Key)
	}
	if rec.Value != nil {
		msg.Value = sarama.ByteEncoder(rec.Value)
	}
	if err := fits(msg, limit); err != nil {
		return &ForwardError{Topic: rec.Topic, Partition: -1, Err: err}
	}
	return nil
}

// fits is Fits for a built message.
func fits(msg *sarama.ProducerMessage, limit int) error {
	if limit > 0 {
		if size := msg.ByteSize(2); size > limit {
			return fmt.Errorf("%w: record is %d bytes, Producer.MaxMessageBytes is %d", sarama.ErrMessageSizeTooLarge, size, limit)
		}
	}
	return nil
}

// partition picks rec's destination partition.
func (f *Forwarder) partition(rec Record) (int32, error) {
	ps, err := f.client.Partitions(rec.Topic)
	if err != nil {
		return -1, fmt.Errorf("partitions: %w", err)
	}
	n := int32(len(ps))
	if n == 0 {
		return -1, fmt.Errorf("partitions: %w", sarama.ErrLeaderNotAvailable)
	}
	switch {
	case rec.Partition >= 0 && rec.Partition < n:
		return rec.Partition, nil
	case rec.Key == nil:
		p := rec.Partition % n
		if p < 0 {
			p += n
		}
		return p, nil
	}
	f.mu.Lock()
	h, ok := f.hashes[rec.Topic]
	if !ok {
		h = sarama.NewHashPartitioner(rec.Topic)
		f.hashes[rec.Topic] = h
	}
	f.mu.Unlock()
	p, err := h.Partition(&sarama.ProducerMessage{Topic: rec.Topic, Key: sarama.ByteEncoder(rec.Key)}, n)
	if err != nil {
		return -1, err
	}
	if p < 0 || p >= n {
		return -1, errors.New("hash partitioner gave an invalid partition")
	}
	return p, nil
}

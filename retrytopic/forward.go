package retrytopic

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// ConfigureProducer sets on cfg what a producer used by a Forwarder needs so
// that an acknowledged forward is durable and never duplicated by producer
// retries:
//
//	cfg.Producer.Idempotent = true              // Kafka: enable.idempotence=true
//	cfg.Net.MaxOpenRequests = 1                 // sarama requires it with Idempotent
//	cfg.Producer.RequiredAcks = sarama.WaitForAll // Kafka: acks=all
//	cfg.Producer.Return.Successes = true        // SyncProducer requires it
//	cfg.Producer.Return.Errors = true
//	cfg.Producer.Partitioner = sarama.NewManualPartitioner // the Forwarder picks the partition
//	cfg.Metadata.AllowAutoTopicCreation = false // idem never auto-creates a topic
//	cfg.Version = sarama.V4_0_0_0               // only when cfg.Version is older
//
// With auto-creation off, a forward to a topic that does not exist fails
// (UNKNOWN_TOPIC_OR_PARTITION, an outage: the caller waits and retries)
// instead of creating a topic nobody reads. Other settings (retries,
// timeouts, compression, Producer.MaxMessageBytes) are left as they are; see
// EnsureTopicsFor for the size limit a forward producer needs.
func ConfigureProducer(cfg *sarama.Config) {
	cfg.Metadata.AllowAutoTopicCreation = false
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	if !cfg.Version.IsAtLeast(sarama.V4_0_0_0) {
		cfg.Version = sarama.V4_0_0_0
	}
	if cfg.Producer.Retry.Max < 1 {
		cfg.Producer.Retry.Max = 1 // sarama: Idempotent needs Retry.Max >= 1
	}
}

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
// configured as ConfigureProducer says (manual partitioner, idempotent,
// acks=all); build it with sarama.NewSyncProducerFromClient(client) so both
// see the same metadata. The caller keeps ownership of p and client.
func NewForwarder(p sarama.SyncProducer, client sarama.Client) *Forwarder {
	return &Forwarder{producer: p, client: client, hashes: map[string]sarama.Partitioner{}}
}

// NewForwarderFromClient creates a sync producer on client and returns a
// Forwarder that owns it (Close closes it, not the client). client's config
// must satisfy ConfigureProducer.
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
// sarama.ErrMessageSizeTooLarge. IsPermanentForwardError tells a refusal that
// no retry can change (too large, not authorised, invalid) from an outage.
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
	if limit := f.client.Config().Producer.MaxMessageBytes; limit > 0 {
		if size := msg.ByteSize(2); size > limit {
			return &ForwardError{Topic: rec.Topic, Partition: part, Err: fmt.Errorf(
				"%w: record is %d bytes, Producer.MaxMessageBytes is %d", sarama.ErrMessageSizeTooLarge, size, limit)}
		}
	}
	if _, _, err := f.producer.SendMessage(msg); err != nil {
		return &ForwardError{Topic: rec.Topic, Partition: part, Err: err}
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

// permanentForwardErrors are the Kafka error codes IsPermanentForwardError
// treats as permanent. Keep the list in IsPermanentForwardError's doc.
var permanentForwardErrors = []sarama.KError{
	sarama.ErrMessageSizeTooLarge,                // 10 MESSAGE_TOO_LARGE
	sarama.ErrInvalidTopic,                       // 17 INVALID_TOPIC_EXCEPTION
	sarama.ErrMessageSetSizeTooLarge,             // 18 RECORD_LIST_TOO_LARGE
	sarama.ErrTopicAuthorizationFailed,           // 29 TOPIC_AUTHORIZATION_FAILED
	sarama.ErrClusterAuthorizationFailed,         // 31 CLUSTER_AUTHORIZATION_FAILED
	sarama.ErrInvalidTimestamp,                   // 32 INVALID_TIMESTAMP
	sarama.ErrUnsupportedForMessageFormat,        // 43 UNSUPPORTED_FOR_MESSAGE_FORMAT
	sarama.ErrPolicyViolation,                    // 44 POLICY_VIOLATION
	sarama.ErrTransactionalIDAuthorizationFailed, // 53 TRANSACTIONAL_ID_AUTHORIZATION_FAILED
	sarama.ErrUnsupportedCompressionType,         // 76 UNSUPPORTED_COMPRESSION_TYPE
	sarama.ErrInvalidRecord,                      // 87 INVALID_RECORD
}

// IsPermanentForwardError reports whether err, returned by Forward (or by any
// sarama producer), means the destination refuses this record for good: no
// retry of the same record to the same topic can succeed, so waiting would
// stall the partition for ever. It is the one place idem classifies producer
// errors.
//
// Permanent (the record is dead-lettered instead: whole, or as a stub
// without its value if the dead-letter topic refuses it too):
//
//	MESSAGE_TOO_LARGE (10)                    sarama.ErrMessageSizeTooLarge, also returned by Forward
//	                                          before sending a record above Producer.MaxMessageBytes
//	RECORD_LIST_TOO_LARGE (18)                sarama.ErrMessageSetSizeTooLarge (e.g. a batch above segment.bytes)
//	INVALID_RECORD (87)                       sarama.ErrInvalidRecord (e.g. a nil key on a compacted topic)
//	INVALID_TIMESTAMP (32)                    sarama.ErrInvalidTimestamp
//	INVALID_TOPIC_EXCEPTION (17)              sarama.ErrInvalidTopic
//	TOPIC_AUTHORIZATION_FAILED (29)           sarama.ErrTopicAuthorizationFailed
//	CLUSTER_AUTHORIZATION_FAILED (31)         sarama.ErrClusterAuthorizationFailed
//	TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) sarama.ErrTransactionalIDAuthorizationFailed
//	UNSUPPORTED_FOR_MESSAGE_FORMAT (43)       sarama.ErrUnsupportedForMessageFormat
//	POLICY_VIOLATION (44)                     sarama.ErrPolicyViolation
//	UNSUPPORTED_COMPRESSION_TYPE (76)         sarama.ErrUnsupportedCompressionType
//	sarama.ConfigurationError "Attempt to produce message larger than configured Producer.MaxMessageBytes"
//	                                          (sarama's own client-side size check)
//
// Everything else is an outage (false): the partition waits and retries the
// same forward. That includes UNKNOWN_TOPIC_OR_PARTITION (3, a deleted
// topic: it may be created again), LEADER_NOT_AVAILABLE (5),
// NOT_LEADER_OR_FOLLOWER (6), REQUEST_TIMED_OUT (7), NETWORK_EXCEPTION (13),
// CORRUPT_MESSAGE (2, a CRC error on the way), NOT_ENOUGH_REPLICAS (19, 20),
// OUT_OF_ORDER_SEQUENCE_NUMBER (45), broker and
// network errors (sarama.ErrOutOfBrokers, net.Error, io.EOF), and context
// cancellation. err may be wrapped (*ForwardError, sarama.ProducerError,
// fmt.Errorf %w, errors.Join: permanent if any joined error is).
func IsPermanentForwardError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, k := range permanentForwardErrors {
		if errors.Is(err, k) {
			return true
		}
	}
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) && strings.Contains(string(ce), "larger than configured Producer.MaxMessageBytes") {
		return true
	}
	return false
}

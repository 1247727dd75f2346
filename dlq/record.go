package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/committed"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// idempotencyKeyHeader is the header idem reads the idempotency key from by
// default; Show and Filter match it as well as the record key.
const idempotencyKeyHeader = "idempotency-key"

// derivedKeyHeader is the header in which the consumer writes, on every
// record it forwards, the idempotency key it derived (from a header, the
// Kafka key or a JSON field of the body). Show, Filter and IdempotencyKey
// read it first. (internal/wire.HeaderIdempotencyKey names it too.)
const derivedKeyHeader = "idem-idempotency-key"

// Record is one dead-lettered record: the record as it was forwarded (key and
// value byte for byte, the original headers followed by the idem-* headers)
// with its failure decoded.
type Record struct {
	// Topic, Partition and Offset locate the record in the dead-letter topic.
	Topic     string
	Partition int32
	Offset    int64
	// Timestamp is the record's own timestamp (when it was dead-lettered).
	Timestamp time.Time
	// Key and Value are the raw bytes; Value is nil for a tombstone.
	Key, Value []byte
	// Headers are all the record's headers, in order.
	Headers []sarama.RecordHeader
	// Failure is what the idem-* headers say; HasFailure reports whether the
	// record had any. DecodeErr is non-nil when some idem-* header did not
	// parse; the other fields are still filled.
	Failure    retrytopic.Failure
	HasFailure bool
	DecodeErr  error
}

// FromMessage decodes a consumed dead-letter record (see Record). It never
// fails: headers that do not parse are reported in Record.DecodeErr.
func FromMessage(m *sarama.ConsumerMessage) *Record { return newRecord(m) }

func newRecord(m *sarama.ConsumerMessage) *Record {
	r := &Record{
		Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Timestamp: m.Timestamp,
		Key: m.Key, Value: m.Value,
	}
	r.Headers = make([]sarama.RecordHeader, 0, len(m.Headers))
	for _, h := range m.Headers {
		if h != nil {
			r.Headers = append(r.Headers, *h)
		}
	}
	r.Failure, r.HasFailure, r.DecodeErr = wire.Decode(r.Headers)
	return r
}

// OriginalHeaders returns the headers that are not idem's, in order: the
// headers the record had on its original topic. Replay sends these.
func (r *Record) OriginalHeaders() []sarama.RecordHeader { return wire.StripHeaders(r.Headers) }

// IdempotencyKey returns the idempotency key idem derived for the record: the
// value of the last idem-idempotency-key header (derivedKeyHeader), else of
// the last idempotency-key header, else "".
func (r *Record) IdempotencyKey() string {
	if v, ok := r.header(derivedKeyHeader); ok {
		return v
	}
	v, _ := r.header(idempotencyKeyHeader)
	return v
}

// header returns the value of the last header named key.
func (r *Record) header(key string) (string, bool) {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if string(r.Headers[i].Key) == key {
			return string(r.Headers[i].Value), true
		}
	}
	return "", false
}

// HasKey reports whether k is the record's Kafka key, its derived
// idempotency key (idem-idempotency-key) or its idempotency-key header: what
// Show's Position.Key and Filter.Key match.
func (r *Record) HasKey(k string) bool {
	if string(r.Key) == k {
		return true
	}
	for _, name := range []string{derivedKeyHeader, idempotencyKeyHeader} {
		if v, ok := r.header(name); ok && v == k {
			return true
		}
	}
	return false
}

// IsStub reports whether the record is a dead-letter stub: its value was
// left out (idem-payload-omitted) because no topic would take it whole.
// Replay never sends a stub.
func (r *Record) IsStub() bool { return r.Failure.Stub }

// Fingerprint identifies the way r failed: the first 12 hex digits of the
// SHA-256 of its idem-error-kind, idem-error-type and idem-error, with the
// parts of the message that vary between occurrences of one failure (quoted
// strings, UUIDs, hex ids, numbers) collapsed first. Records with the same
// fingerprint failed the same way: List groups by it, Filter selects by it
// and the failure console groups its index by it.
func (r *Record) Fingerprint() string {
	return fingerprint(r.Failure.Kind, r.Failure.ErrorType, r.Failure.Error)
}

// LastFailureAt is idem-last-failure-at, or the record timestamp when that
// header is missing.
func (r *Record) LastFailureAt() time.Time {
	if !r.Failure.LastFailureAt.IsZero() {
		return r.Failure.LastFailureAt
	}
	return r.Timestamp
}

// readWait bounds how long a read waits for a partition to move (see
// committed.Read): a leader that does not answer, an open transaction.
const readWait = 30 * time.Second

// scan calls fn for every record of topic in spans, partition by partition in
// offset order. It stops at the first error fn returns and returns it. It
// reads as a read_committed consumer does: a dead-letter topic written with
// transactions (consumer.Config's Transactions) holds a commit marker after
// each transaction and may hold the records of aborted ones, which are not
// dead letters; neither reaches fn, and no wait is unbounded.
func (c *Client) scan(ctx context.Context, topic string, spans []span, fn func(*Record) error) error {
	for _, s := range spans {
		if s.Start >= s.End {
			continue
		}
		err := committed.Read(ctx, c.client, topic, s.Partition, s.Start, s.End, readWait, func(m *sarama.ConsumerMessage) error {
			return fn(newRecord(m))
		})
		if err != nil {
			return fmt.Errorf("dlq: read %s/%d from %d: %w", topic, s.Partition, s.Start, err)
		}
	}
	return nil
}

package dlq

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/retrytopic"
)

// IdempotencyKeyHeader is the header idem reads the idempotency key from by
// default; Show and Filter match it as well as the record key.
const IdempotencyKeyHeader = "idempotency-key"

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
	// parse (see retrytopic.Decode); the other fields are still filled.
	Failure    retrytopic.Failure
	HasFailure bool
	DecodeErr  error
}

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
	r.Failure, r.HasFailure, r.DecodeErr = retrytopic.Decode(r.Headers)
	return r
}

// OriginalHeaders returns the headers that are not idem's, in order: the
// headers the record had on its original topic. Replay sends these.
func (r *Record) OriginalHeaders() []sarama.RecordHeader { return retrytopic.StripHeaders(r.Headers) }

// IdempotencyKey returns the value of the last idempotency-key header, or "".
func (r *Record) IdempotencyKey() string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if string(r.Headers[i].Key) == IdempotencyKeyHeader {
			return string(r.Headers[i].Value)
		}
	}
	return ""
}

// Fingerprint groups records failing the same way: see Fingerprint.
func (r *Record) Fingerprint() string {
	return Fingerprint(r.Failure.Kind, r.Failure.ErrorType, r.Failure.Error)
}

// LastFailureAt is idem-last-failure-at, or the record timestamp when that
// header is missing.
func (r *Record) LastFailureAt() time.Time {
	if !r.Failure.LastFailureAt.IsZero() {
		return r.Failure.LastFailureAt
	}
	return r.Timestamp
}

// scan calls fn for every record of topic in spans, partition by partition in
// offset order. It stops at the first error fn returns and returns it.
// Dead-letter topics are written without transactions, so every offset in a
// span holds a record; a span ending in a transaction marker would make scan
// wait until ctx is done.
func (c *Client) scan(ctx context.Context, topic string, spans []span, fn func(*Record) error) error {
	var consumer sarama.Consumer
	defer func() {
		if consumer != nil {
			_ = consumer.Close()
		}
	}()
	for _, s := range spans {
		if s.Start >= s.End {
			continue
		}
		if consumer == nil {
			var err error
			if consumer, err = sarama.NewConsumerFromClient(c.client); err != nil {
				return fmt.Errorf("dlq: consumer: %w", err)
			}
		}
		if err := c.scanSpan(ctx, consumer, topic, s, fn); err != nil {
			return err
		}
	}
	return nil
}

func (c *Client) scanSpan(ctx context.Context, consumer sarama.Consumer, topic string, s span, fn func(*Record) error) error {
	pc, err := consumer.ConsumePartition(topic, s.Partition, s.Start)
	if err != nil {
		return fmt.Errorf("dlq: read %s/%d from %d: %w", topic, s.Partition, s.Start, err)
	}
	defer func() { _ = pc.Close() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case m, ok := <-pc.Messages():
			if !ok {
				return fmt.Errorf("dlq: read %s/%d: consumer closed", topic, s.Partition)
			}
			if m.Offset >= s.End {
				return nil
			}
			if err := fn(newRecord(m)); err != nil {
				return err
			}
			if m.Offset+1 >= s.End {
				return nil
			}
		case err, ok := <-pc.Errors():
			if ok {
				return fmt.Errorf("dlq: read %s/%d: %w", topic, s.Partition, err)
			}
		}
	}
}

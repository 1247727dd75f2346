package outbox

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/internal/outboxstore"
)

// This file publishes a round's heads to Kafka and classifies each failed
// publish as a rejection of the record or an outage (Relay's doc, "Bad
// input and outages").

// publish sends heads, each in its publish span, and waits for every ack or
// error; errs[i] is heads[i]'s.
func (s *session) publish(heads []row) []error {
	errs := make([]error, len(heads))
	msgs := make([]*sarama.ProducerMessage, len(heads))
	spans := make([]trace.Span, len(heads))
	for i := range heads {
		h := heads[i] // a copy: the span's context goes into the record, not the row
		h.hkeys, h.hvals = slices.Clone(h.hkeys), slices.Clone(h.hvals)
		spans[i] = s.publishSpan(&h)
		msgs[i] = h.message(i)
	}
	if s.txn != nil {
		return s.publishInTurn(msgs, spans)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, m := range msgs {
			s.prod.Input() <- m
		}
	})
	for range heads {
		select {
		case m := <-s.prod.Successes():
			i := m.Metadata.(int)
			errs[i] = nil
			endPublishSpan(spans[i], m.Partition, m.Offset, nil)
		case e := <-s.prod.Errors():
			i := e.Msg.Metadata.(int)
			errs[i] = e.Err
			endPublishSpan(spans[i], e.Msg.Partition, -1, e.Err)
		}
	}
	wg.Wait()
	return errs
}

// publishInTurn is publish with ExactlyOnce: one record in the producer at
// a time, and none after one failed (the transaction is lost; the rest are
// given sarama.ErrTransactionNotReady, not their failure). sarama v1.61.1
// races when a transaction fails with records in flight: it reads the
// transaction's last error in one goroutine while a failing record's retry
// or return writes it in another (IBM/sarama#2913; the swarm's -race
// members met it, issue 28). With one record in flight, a failure has
// nothing to race with.
func (s *session) publishInTurn(msgs []*sarama.ProducerMessage, spans []trace.Span) []error {
	errs := make([]error, len(msgs))
	failed := false
	for i, m := range msgs {
		if failed {
			errs[i] = sarama.ErrTransactionNotReady
			endPublishSpan(spans[i], m.Partition, -1, errs[i])
			continue
		}
		s.prod.Input() <- m
		select {
		case ok := <-s.prod.Successes():
			endPublishSpan(spans[i], ok.Partition, ok.Offset, nil)
		case e := <-s.prod.Errors():
			errs[i], failed = e.Err, true
			endPublishSpan(spans[i], e.Msg.Partition, -1, e.Err)
		}
	}
	return errs
}

// message builds row r's record; meta is its index in the round.
func (r row) message(meta int) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: r.topic, Metadata: meta}
	if r.key != nil {
		m.Key = sarama.ByteEncoder(r.key)
	}
	if r.value != nil {
		m.Value = sarama.ByteEncoder(r.value)
	}
	hasKey := false
	m.Headers = make([]sarama.RecordHeader, 0, len(r.hkeys)+2)
	for i, k := range r.hkeys {
		if k == outboxstore.HeaderID {
			continue // the relay's own, set below
		}
		hasKey = hasKey || k == HeaderIdempotencyKey
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(k), Value: r.hvals[i]})
	}
	m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(outboxstore.HeaderID), Value: []byte(r.eventID)})
	if !hasKey {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(HeaderIdempotencyKey), Value: []byte(r.eventID)})
	}
	return m
}

// failure is a row whose publish failed this round.
type failure struct {
	id       int64
	err      string
	wait     time.Duration
	reason   string
	rejected bool // Kafka refused the record itself: counts towards MaxAttempts
	final    bool // the row moves to the failed state
}

// failures classifies the round's failed publishes, and logs each rejection
// and one line for the round's outages.
func (s *session) failures(heads []row, errs []error) []failure {
	var out []failure
	var outages int
	var firstOutage error
	for i, h := range heads {
		err := errs[i]
		if err == nil {
			continue
		}
		f := s.failure(h, err)
		out = append(out, f)
		switch {
		case f.final:
			s.log.Error("idem: outbox row failed for good; `idem outbox retry` sends it again",
				"id", h.id, "topic", h.topic, "rejections", h.rejects+1, "reason", f.reason, "err", err)
		case f.rejected:
			s.log.Warn("idem: Kafka rejected an outbox row; will retry", "id", h.id, "topic", h.topic,
				"rejections", h.rejects+1, "max", s.cfg.MaxAttempts, "reason", f.reason, "err", err, "in", f.wait)
		default:
			if outages == 0 {
				firstOutage = err
			}
			outages++
		}
	}
	if outages > 0 {
		s.log.Warn("idem: outbox publish failed (outage: brokers, credentials, authorization or topic); will retry, not counted against the rows",
			"rows", outages, "err", firstOutage)
	}
	return out
}

func (s *session) failure(r row, err error) failure {
	reason := failureReason(err)
	s.m.PublishFailures.WithLabelValues(s.t.name, reason).Inc()
	f := failure{id: r.id, err: err.Error(), reason: reason, rejected: rejected(err), wait: s.retryWait(r.attempts + 1)}
	f.final = f.rejected && r.rejects+1 >= s.cfg.MaxAttempts
	return f
}

// retryWait is the wait before a row's next try after its attempts-th
// failed one: a random time in [1ms, min(RetryMax, RetryBase·2^(attempts-1))].
func (s *session) retryWait(attempts int) time.Duration {
	ceil := s.cfg.RetryBase << min(attempts-1, 30)
	if ceil <= 0 || ceil > s.cfg.RetryMax {
		ceil = s.cfg.RetryMax
	}
	return max(time.Duration(s.rand.Int64N(int64(ceil)+1)), time.Millisecond)
}

// Reason label values of idem_outbox_publish_failures_total. Only the
// rejections of a record itself count towards Relay.MaxAttempts (see
// rejected): too_large, and the invalid records counted under other.
// unknown_topic, authorization and the rest of other (broker outages,
// timeouts, SASL) are outages, retried for as long as they last.
const (
	reasonUnknownTopic  = "unknown_topic"
	reasonTooLarge      = "too_large"
	reasonAuthorization = "authorization"
	reasonOther         = "other"
)

// failureReason classifies a publish error into the bounded reason label of
// idem_outbox_publish_failures_total: reasonUnknownTopic,
// reasonTooLarge, reasonAuthorization or reasonOther. Only errors rejected
// reports count towards Relay.MaxAttempts; the others are outages.
func failureReason(err error) string {
	switch {
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition), errors.Is(err, sarama.ErrInvalidTopic):
		return reasonUnknownTopic
	case tooLarge(err):
		return reasonTooLarge
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed), errors.Is(err, sarama.ErrClusterAuthorizationFailed),
		errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed), errors.Is(err, sarama.ErrSASLAuthenticationFailed):
		return reasonAuthorization
	}
	return reasonOther
}

// rejected reports whether err is Kafka (or the producer) refusing the
// record itself, so that publishing it again will fail the same way however
// long one waits: a record too large for the producer or the topic, a record
// the broker finds invalid (a keyless record on a compacted topic) or whose
// timestamp it refuses. Only these count towards Relay.MaxAttempts. Every
// other error is an outage of the cluster or the topic, retried without
// counting: brokers unreachable, timeouts, SASL authentication, cluster,
// topic or transactional-id authorization (credentials being rotated, ACLs
// being granted), an unknown topic (not created yet).
func rejected(err error) bool {
	return tooLarge(err) || errors.Is(err, sarama.ErrInvalidRecord) || errors.Is(err, sarama.ErrInvalidTimestamp)
}

func tooLarge(err error) bool {
	var ce sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrMessageSetSizeTooLarge) ||
		errors.As(err, &ce) && strings.Contains(string(ce), "MaxMessageBytes")
}

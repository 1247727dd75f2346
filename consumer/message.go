package consumer

import (
	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
)

// toMessage converts a sarama record; the Message shares its byte slices.
func toMessage(cm *sarama.ConsumerMessage) *handler.Message { return newMessage(cm, nil) }

// messages is a worker's supply of handler.Messages: it interns their
// header names (headerNames) and keeps the Message of the last record that
// ended processed or duplicate, for the next record (reuse). One per worker,
// so it needs no lock.
type messages struct {
	names headerNames
	// spare is the Message of the last record handleAfter took to processed
	// or duplicate, for the next record (reuse); nil when none.
	spare *messageAlloc
}

// fresh is toMessage with header names interned in the worker's cache: a
// Message of its own, for a record the worker may keep (a batch's).
func (s *messages) fresh(cm *sarama.ConsumerMessage) *handler.Message {
	return newMessage(cm, &s.names)
}

// headerNames interns header names: a record's few header names
// ("idempotency-key", the idem-* ones) are found by comparing bytes with the
// names seen before, most recent first, with no allocation and no hashing
// (a map lookup hashed every name of every record: 7 % of the no-op path's
// CPU). At most maxNames are kept; other names are copied per record.
type headerNames []string

// intern returns a string equal to key, shared when key was seen before.
func (n *headerNames) intern(key []byte) string {
	if n == nil {
		return string(key)
	}
	for _, s := range *n {
		if s == string(key) { // compared in place, no allocation
			return s
		}
	}
	s := string(key)
	if len(*n) < maxNames {
		*n = append(*n, s)
	}
	return s
}

// messageAlloc holds a Message and room for its first headers, so that a
// record with few headers costs one allocation.
type messageAlloc struct {
	m  handler.Message
	hs [4]handler.Header
}

// maxNames bounds a worker's cache of header names; the cache is scanned
// linearly, so it stays small.
const maxNames = 16

// newMessage converts cm. Header names are looked up in names (when not nil)
// so the common ones ("idempotency-key", idem-*) are not copied per record.
func newMessage(cm *sarama.ConsumerMessage, names *headerNames) *handler.Message {
	a := new(messageAlloc)
	a.fill(cm, names)
	return &a.m
}

// fill makes a the conversion of cm, as newMessage; whatever a held before
// is gone.
func (a *messageAlloc) fill(cm *sarama.ConsumerMessage, names *headerNames) {
	*a = messageAlloc{m: handler.Message{
		Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset,
		Key: cm.Key, Value: cm.Value, Timestamp: cm.Timestamp,
		Original: handler.Origin{Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset, Timestamp: cm.Timestamp},
	}}
	hs := a.hs[:0]
	if len(cm.Headers) > len(a.hs) {
		hs = make([]handler.Header, 0, len(cm.Headers))
	}
	for _, h := range cm.Headers {
		if h == nil {
			continue
		}
		hs = append(hs, handler.Header{Key: names.intern(h.Key), Value: h.Value})
	}
	a.m.Headers = hs
}

// reuse is fresh for handleAfter: the Message of the last record that
// handleAfter took to processed or duplicate (spare), filled anew, or a new
// one. Nothing keeps such a Message once its record is marked: the handler
// may not (handler.Handler's contract), and idem keeps only the messages it
// parks, forwards, defers, expires or batches, which never go back to spare.
func (s *messages) reuse(cm *sarama.ConsumerMessage) *messageAlloc {
	a := s.spare
	if a == nil {
		a = new(messageAlloc)
	}
	s.spare = nil
	a.fill(cm, &s.names)
	return a
}

// keepAfter makes a the spare once settled is nil: a's record ended
// processed or duplicate and was settled, so nothing keeps a (reuse).
// It returns settled.
func (s *messages) keepAfter(a *messageAlloc, settled error) error {
	if settled == nil {
		s.spare = a
	}
	return settled
}

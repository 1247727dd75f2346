// Package wire is idem's wire contract in Go: the idem-* headers a record
// forwarded to a retry tier or to the dead-letter topic carries, and the codec
// between them and a retrytopic.Failure (Encode, Decode, NewFailure,
// StripHeaders), the error a failure names (Cause, HTTPStatusOf) and the
// Kafka protocol version idem speaks (KafkaVersion). The header names are
// fixed by DESIGN.md's wire contract;
// only idem's own packages write and read them. Users read a dead-lettered
// record's failure through dlq.Record (dlq.FromMessage) and its own headers
// through dlq.Record.OriginalHeaders.
package wire

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/retrytopic"
)

// The wire contract: the headers idem adds to a record it forwards to a retry
// tier or to the dead-letter topic. Every value is UTF-8 text (numbers in
// decimal, times in unix milliseconds) so `kcat -J` shows them plainly.
// Encode replaces all of them on every forward; they are never duplicated.
// Only these names are idem's (IsIdemHeader): any other header, even one whose
// name starts with HeaderPrefix (outbox.Relay's idem-outbox-id), belongs to
// the record and travels with it unchanged.
const (
	// HeaderPrefix starts the name of every header of the wire contract. A
	// name with this prefix that is not one of the constants below is not
	// idem's: Encode, StripHeaders and Decode leave it alone.
	HeaderPrefix = "idem-"

	HeaderAttempt           = "idem-attempt"            // deliveries to a handler so far, decimal
	HeaderTier              = "idem-tier"               // retry tier the record was sent to (1…); 0 for the dead-letter topic
	HeaderDueAt             = "idem-due-at"             // unix ms before which the record must not be handled, rounded up; absent for the DLQ
	HeaderOriginalTopic     = "idem-original-topic"     // topic the record was first consumed from
	HeaderOriginalPartition = "idem-original-partition" // its partition there, decimal
	HeaderOriginalOffset    = "idem-original-offset"    // its offset there, decimal
	HeaderOriginalTimestamp = "idem-original-timestamp" // its timestamp there, unix ms
	HeaderConsumerGroup     = "idem-consumer-group"     // consumer group that failed to handle it
	HeaderError             = "idem-error"              // last error message (capped at MaxErrorBytes)
	HeaderErrorKind         = "idem-error-kind"         // handler.Kind: retriable|permanent|panic|missing-key|invalid-key|decode|timeout|expired|invalid-header
	HeaderErrorType         = "idem-error-type"         // Go type of Cause(err), as fmt %T prints it
	HeaderStack             = "idem-stack"              // panic stack (capped at MaxStackBytes)
	HeaderFirstFailureAt    = "idem-first-failure-at"   // unix ms of the first failure
	HeaderLastFailureAt     = "idem-last-failure-at"    // unix ms of the latest failure
	HeaderPayloadOmitted    = "idem-payload-omitted"    // on a stub only: size in bytes of the value that was left out, decimal
	HeaderForwardError      = "idem-forward-error"      // why the record could not go where it was going (a producer error); capped at MaxErrorBytes
	HeaderIdempotencyKey    = "idem-idempotency-key"    // the idempotency key the consumer derived (Config.KeyFunc), as the inbox holds it; absent when there was none
	HeaderHeadersOmitted    = "idem-headers-omitted"    // on a last-resort stub only: how many of the record's own headers were left out, decimal
	HeaderSchemaID          = "idem-schema-id"          // a record that did not decode: the schema registry id its value names, decimal; absent when unknown
	HeaderSchemaSubject     = "idem-schema-subject"     // a record that did not decode: a registry subject of that schema; absent when unknown
)

// wireHeaders are the names of the wire contract, the only headers idem owns.
var wireHeaders = map[string]struct{}{
	HeaderAttempt: {}, HeaderTier: {}, HeaderDueAt: {}, HeaderOriginalTopic: {}, HeaderOriginalPartition: {},
	HeaderOriginalOffset: {}, HeaderOriginalTimestamp: {}, HeaderConsumerGroup: {}, HeaderError: {},
	HeaderErrorKind: {}, HeaderErrorType: {}, HeaderStack: {}, HeaderFirstFailureAt: {}, HeaderLastFailureAt: {},
	HeaderPayloadOmitted: {}, HeaderForwardError: {}, HeaderIdempotencyKey: {}, HeaderHeadersOmitted: {},
	HeaderSchemaID: {}, HeaderSchemaSubject: {},
}

// MaxStackBytes caps idem-stack; a longer stack is cut at a UTF-8 boundary.
const MaxStackBytes = 8 << 10

// MaxErrorBytes caps idem-error; a longer message is cut at a UTF-8 boundary.
const MaxErrorBytes = 8 << 10

// Source locates the record that failed, as the consumer read it: for a record
// read from a retry tier these are the tier's coordinates.
type Source struct {
	Topic     string
	Partition int32
	Offset    int64
	Timestamp time.Time
	// Group is the consumer group handling the record.
	Group string
}

// NewFailure describes a failure of the record at src with err at now.
//
// prior is the Failure decoded from the record's own headers (zero when it had
// none, i.e. it came from the original topic). When prior names an original
// topic, its original-* coordinates and FirstFailureAt are kept, so a record
// moving through the tiers always points at where it was first consumed;
// otherwise they are taken from src and now.
//
// Error, Kind (handler.ErrorKind), ErrorType (%T of Cause(err)) and
// Stack (of a *handler.PanicError in err's chain) describe err, and SchemaID
// and SchemaSubject the schema of a value that did not decode: an error in
// err's chain with a SchemaRef() (id int, subject string) method (serde's
// *DecodeError has one; wire does not import serde). Attempt is
// prior.Attempt+1; the consumer overwrites it with the message's delivery
// count. Tier and DueAt are left zero for the caller to set.
func NewFailure(err error, src Source, prior retrytopic.Failure, now time.Time) retrytopic.Failure {
	f := retrytopic.Failure{
		Attempt:           prior.Attempt + 1,
		OriginalTopic:     src.Topic,
		OriginalPartition: src.Partition,
		OriginalOffset:    src.Offset,
		OriginalTimestamp: src.Timestamp,
		Group:             src.Group,
		FirstFailureAt:    now,
		LastFailureAt:     now,
	}
	if prior.OriginalTopic != "" {
		f.OriginalTopic = prior.OriginalTopic
		f.OriginalPartition = prior.OriginalPartition
		f.OriginalOffset = prior.OriginalOffset
		f.OriginalTimestamp = prior.OriginalTimestamp
	}
	if !prior.FirstFailureAt.IsZero() {
		f.FirstFailureAt = prior.FirstFailureAt
	}
	if err != nil {
		f.Error = err.Error()
		f.Kind = handler.ErrorKind(err)
		f.ErrorType = fmt.Sprintf("%T", Cause(err))
		var p *handler.PanicError
		if errors.As(err, &p) {
			f.Stack = p.Stack
		}
		var ref schemaRef
		if errors.As(err, &ref) {
			f.SchemaID, f.SchemaSubject = ref.SchemaRef()
		}
	}
	return f
}

// schemaRef is an error that names the registry schema of a value it could
// not decode (serde.DecodeError).
type schemaRef interface {
	error
	SchemaRef() (id int, subject string)
}

// AnyHeader is the header types Encode and Decode accept: sarama's producer
// headers, the consumer's header pointers, and handler.Message headers.
type AnyHeader interface {
	sarama.RecordHeader | *sarama.RecordHeader | handler.Header
}

// kv returns h's key and value; ok is false for a nil *sarama.RecordHeader.
func kv[H AnyHeader](h H) (key, value []byte, ok bool) {
	switch h := any(h).(type) {
	case sarama.RecordHeader:
		return h.Key, h.Value, true
	case *sarama.RecordHeader:
		if h == nil {
			return nil, nil, false
		}
		return h.Key, h.Value, true
	case handler.Header:
		return []byte(h.Key), h.Value, true
	}
	return nil, nil, false
}

// IsIdemHeader reports whether a header name belongs to idem: one of the wire
// contract's Header* names. Other names starting with HeaderPrefix (such as
// outbox.Relay's idem-outbox-id) are not idem's here.
func IsIdemHeader(key []byte) bool {
	if len(key) < len(HeaderPrefix) || string(key[:len(HeaderPrefix)]) != HeaderPrefix {
		return false // the common case: no lookup
	}
	_, ok := wireHeaders[string(key)] // no allocation for the lookup
	return ok
}

// StripHeaders returns the headers of hs that are not idem's (IsIdemHeader),
// in order: the ones a replay or a forward keeps. The returned headers share
// their bytes with hs.
func StripHeaders[H AnyHeader](hs []H) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, 0, len(hs))
	for _, h := range hs {
		k, v, ok := kv(h)
		if ok && !IsIdemHeader(k) {
			out = append(out, sarama.RecordHeader{Key: k, Value: v})
		}
	}
	return out
}

// Encode returns the headers of a forwarded record: orig's non-idem headers in
// their order, followed by f's idem-* headers. Every header of orig that is
// idem's (IsIdemHeader) is dropped, so forwarding a forwarded record replaces, never duplicates. The
// returned headers share their bytes with orig. Zero times and empty strings
// are omitted; Error, ForwardError and Stack are made valid UTF-8 and capped
// at MaxErrorBytes and MaxStackBytes. DueAt is rounded up to the next
// millisecond (dueMilli), so the decoded due time is never early; the other
// times are truncated to the millisecond.
func Encode[H AnyHeader](orig []H, f retrytopic.Failure) []sarama.RecordHeader {
	out := StripHeaders(orig)
	add := func(k, v string) {
		out = append(out, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
	addTime := func(k string, t time.Time) {
		if !t.IsZero() {
			add(k, strconv.FormatInt(t.UnixMilli(), 10))
		}
	}
	addDue := func(k string, t time.Time) {
		if !t.IsZero() {
			add(k, strconv.FormatInt(dueMilli(t), 10))
		}
	}
	addString := func(k, v string) {
		if v != "" {
			add(k, v)
		}
	}
	add(HeaderAttempt, strconv.Itoa(f.Attempt))
	add(HeaderTier, strconv.Itoa(f.Tier))
	addDue(HeaderDueAt, f.DueAt)
	addString(HeaderOriginalTopic, f.OriginalTopic)
	add(HeaderOriginalPartition, strconv.FormatInt(int64(f.OriginalPartition), 10))
	add(HeaderOriginalOffset, strconv.FormatInt(f.OriginalOffset, 10))
	addTime(HeaderOriginalTimestamp, f.OriginalTimestamp)
	addString(HeaderConsumerGroup, f.Group)
	addString(HeaderError, capUTF8(f.Error, MaxErrorBytes))
	addString(HeaderErrorKind, string(f.Kind))
	addString(HeaderErrorType, f.ErrorType)
	addString(HeaderStack, capUTF8(string(f.Stack), MaxStackBytes))
	addTime(HeaderFirstFailureAt, f.FirstFailureAt)
	addTime(HeaderLastFailureAt, f.LastFailureAt)
	if f.Stub {
		add(HeaderPayloadOmitted, strconv.Itoa(f.OmittedBytes))
	}
	addString(HeaderForwardError, capUTF8(f.ForwardError, MaxErrorBytes))
	addString(HeaderIdempotencyKey, f.IdempotencyKey)
	if f.OmittedHeaders > 0 {
		add(HeaderHeadersOmitted, strconv.Itoa(f.OmittedHeaders))
	}
	if f.SchemaID != 0 {
		add(HeaderSchemaID, strconv.Itoa(f.SchemaID))
	}
	addString(HeaderSchemaSubject, f.SchemaSubject)
	return out
}

// dueMilli is due in unix milliseconds rounded UP, the value Encode writes as
// idem-due-at: a record decoded from it is never due before the true due
// time, only up to a millisecond after it.
func dueMilli(due time.Time) int64 {
	ms := due.UnixMilli()
	if ms < math.MaxInt64 && time.UnixMilli(ms).Before(due) {
		ms++
	}
	return ms
}

// capUTF8 makes s valid UTF-8 and cuts it to at most max bytes on a rune
// boundary.
func capUTF8(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= max {
		return s
	}
	s = s[:max]
	for len(s) > 0 {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size > 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// invalidHeaderError reports an idem-* header whose value Decode cannot parse.
type invalidHeaderError struct {
	Header string // e.g. "idem-attempt"
	Value  string // the raw value
	Err    error  // the parse error
}

// Error describes the failure in one line.
func (e *invalidHeaderError) Error() string {
	return fmt.Sprintf("wire: header %s=%q: %v", e.Header, e.Value, e.Err)
}

// Unwrap returns the parse error.
func (e *invalidHeaderError) Unwrap() error { return e.Err }

// Decode reads the idem-* headers of hs. ok reports whether hs has any header
// of the wire contract at all (false for a record fresh from its original
// topic). When a header is repeated the last one wins. Other idem-* names are
// not the wire contract's and are ignored.
// A value that does not parse leaves its field zero and is reported as an
// *invalidHeaderError (several are joined with errors.Join); the other fields are
// still filled, so callers may use the Failure with care.
func Decode[H AnyHeader](hs []H) (f retrytopic.Failure, ok bool, err error) {
	var errs []error
	num := func(k, v string, bits int) int64 {
		n, e := strconv.ParseInt(strings.TrimSpace(v), 10, bits)
		if e != nil {
			errs = append(errs, &invalidHeaderError{Header: k, Value: v, Err: e})
			return 0
		}
		return n
	}
	ms := func(k, v string) time.Time {
		n, e := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if e != nil {
			errs = append(errs, &invalidHeaderError{Header: k, Value: v, Err: e})
			return time.Time{}
		}
		return time.UnixMilli(n)
	}
	for _, h := range hs {
		kb, vb, present := kv(h)
		if !present || !IsIdemHeader(kb) {
			continue
		}
		ok = true
		k, v := string(kb), string(vb)
		switch k {
		case HeaderAttempt:
			f.Attempt = int(num(k, v, 32))
		case HeaderTier:
			f.Tier = int(num(k, v, 32))
		case HeaderDueAt:
			f.DueAt = ms(k, v)
		case HeaderOriginalTopic:
			f.OriginalTopic = v
		case HeaderOriginalPartition:
			f.OriginalPartition = int32(num(k, v, 32))
		case HeaderOriginalOffset:
			f.OriginalOffset = num(k, v, 64)
		case HeaderOriginalTimestamp:
			f.OriginalTimestamp = ms(k, v)
		case HeaderConsumerGroup:
			f.Group = v
		case HeaderError:
			f.Error = v
		case HeaderErrorKind:
			f.Kind = handler.Kind(v)
		case HeaderErrorType:
			f.ErrorType = v
		case HeaderStack:
			if len(vb) == 0 {
				f.Stack = nil
			} else {
				f.Stack = append([]byte(nil), vb...)
			}
		case HeaderFirstFailureAt:
			f.FirstFailureAt = ms(k, v)
		case HeaderLastFailureAt:
			f.LastFailureAt = ms(k, v)
		case HeaderPayloadOmitted:
			f.Stub = true
			f.OmittedBytes = int(num(k, v, 32))
		case HeaderForwardError:
			f.ForwardError = v
		case HeaderIdempotencyKey:
			f.IdempotencyKey = v
		case HeaderHeadersOmitted:
			f.OmittedHeaders = int(num(k, v, 32))
		case HeaderSchemaID:
			f.SchemaID = int(num(k, v, 64))
		case HeaderSchemaSubject:
			f.SchemaSubject = v
		}
	}
	return f, ok, errors.Join(errs...)
}

// UnreadableStub returns the headers of the dead-letter stub of a message
// whose payload idem kept sealed at rest and can no longer open (its data
// key destroyed, or tampered with): none of the message's own headers
// (sealed with its value), and the wire contract's with kind permanent,
// err's text as idem-error, src as the origin, ikey as
// idem-idempotency-key, and idem-payload-omitted. Its value is nil. The
// scheduler and `idem ordering release` send it instead of a deferred or
// parked message they cannot read, so the message ends in the dead-letter
// topic, where operators see why, never published and never dropped in
// silence.
func UnreadableStub(src Source, ikey string, err error, now time.Time) []sarama.RecordHeader {
	f := NewFailure(handler.Permanent(err), src, retrytopic.Failure{}, now)
	f.IdempotencyKey = ikey
	f.Stub = true
	return Encode[sarama.RecordHeader](nil, f)
}

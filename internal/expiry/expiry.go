// Package expiry is the test of whether a message is too old to handle: a maximum
// age per topic, measured from the record's timestamp, and a deadline the
// producer sets per message in a header. It is the building block of the
// consumer's expiry step (issue 21, "Expiry"): the consumer calls
// Policy.Check before the handler, before parking a message in ordering
// mode, and when a retry tier's record comes due, and acts on the Status:
//
//	Live           handle the message as usual
//	Expired        do not handle it: dead-letter it with kind "expired"
//	               (or, with Policy.Drop, drop it and count it)
//	InvalidHeader  do not handle it: dead-letter it with kind "invalid-header"
//	               (a deadline that is not a time is a producer's bug; never
//	               dropped, never retried)
//
// Nothing here reads a clock, a database or Kafka: the caller passes now,
// so the decisions are pure and table-tested.
//
// # The deadline header
//
// HeaderDeadline ("idem-deadline") holds the time after which the message
// must not be handled, as unix milliseconds in decimal ("1767225600000",
// the wire contract's time format) or as RFC 3339 text with a zone
// ("2026-01-01T00:00:00Z"). A record may carry it whatever its topic; when
// present more than once the last one counts (as handler.Message.Header).
// Forwarding to a retry tier or the DLQ keeps it (it is not one of the
// headers retrytopic rewrites), so the deadline holds through the tiers.
//
// # Which timestamp
//
// Max age is measured from the timestamp passed to Check. The consumer
// passes the time the message was first produced (handler.Message.Origin's
// Timestamp, idem-original-timestamp in a tier), so a message does not grow
// younger by going through a retry tier or being deferred: a three-day-old
// payment authorisation is three days old wherever it is read.
package expiry

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemhq/idem/handler"
)

// HeaderDeadline is the default name of the per-message deadline header.
const HeaderDeadline = "idem-deadline"

// ErrInvalidPolicy is wrapped by the error Policy.Validate returns; the
// message names the field, the value and the rule.
var ErrInvalidPolicy = errors.New("expiry: invalid policy")

// Policy says when a message has expired. The zero Policy expires nothing
// by age and honours the deadline header.
type Policy struct {
	// MaxAge is the oldest a record of any topic not in MaxAgeByTopic may
	// be, by its timestamp, and still be handled. Zero: no limit by age.
	// Default: 0.
	MaxAge time.Duration
	// MaxAgeByTopic overrides MaxAge for the topics it names (source
	// topics, as handler.Message.Origin names them); a zero value there
	// means no limit for that topic.
	// Default: nil.
	MaxAgeByTopic map[string]time.Duration
	// Header is the name of the per-message deadline header.
	// Default: "idem-deadline".
	Header string
	// Drop drops an expired message (counted, never handled, nothing sent)
	// instead of dead-lettering it with kind "expired". A message with an
	// invalid header is dead-lettered either way.
	// Default: false.
	Drop bool
}

// Validate reports every bad field at once (errors.Join), each error
// wrapping ErrInvalidPolicy: a negative age, an empty topic name, or a
// header name that is not valid UTF-8 or holds a NUL.
func (p Policy) Validate() error {
	var errs []error
	if p.MaxAge < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxAge = %s: must be >= 0 (0: no limit)", ErrInvalidPolicy, p.MaxAge))
	}
	for _, topic := range slices.Sorted(maps.Keys(p.MaxAgeByTopic)) {
		switch age := p.MaxAgeByTopic[topic]; {
		case topic == "":
			errs = append(errs, fmt.Errorf("%w: MaxAgeByTopic has an empty topic name", ErrInvalidPolicy))
		case age < 0:
			errs = append(errs, fmt.Errorf("%w: MaxAgeByTopic[%q] = %s: must be >= 0 (0: no limit)", ErrInvalidPolicy, topic, age))
		}
	}
	if !utf8.ValidString(p.Header) || strings.ContainsRune(p.Header, 0) {
		errs = append(errs, fmt.Errorf("%w: Header = %q: must be valid UTF-8 without NUL", ErrInvalidPolicy, p.Header))
	}
	return errors.Join(errs...)
}

// HeaderName is the deadline header Check reads: Header, or HeaderDeadline.
func (p Policy) HeaderName() string {
	if p.Header == "" {
		return HeaderDeadline
	}
	return p.Header
}

// MaxAgeOf is the maximum age for topic: MaxAgeByTopic[topic] when listed,
// else MaxAge; zero means no limit.
func (p Policy) MaxAgeOf(topic string) time.Duration {
	if age, ok := p.MaxAgeByTopic[topic]; ok {
		return age
	}
	return p.MaxAge
}

// Check is the verdict for a record of topic with timestamp ts and headers,
// at now: Check(ts, headers, p.HeaderName(), p.MaxAgeOf(topic), now).
func (p Policy) Check(topic string, ts time.Time, headers []handler.Header, now time.Time) Result {
	return Check(ts, headers, p.HeaderName(), p.MaxAgeOf(topic), now)
}

// Status is Check's verdict.
type Status uint8

// The verdicts.
const (
	// Live: neither too old nor past its deadline; handle it.
	Live Status = iota
	// Expired: older than its topic's max age, or past its deadline.
	Expired
	// InvalidHeader: the deadline header is there but is not a time.
	InvalidHeader
)

// String is the verdict as the consumer names the outcome: "live",
// "expired", "invalid-header".
func (s Status) String() string {
	switch s {
	case Live:
		return "live"
	case Expired:
		return "expired"
	case InvalidHeader:
		return "invalid-header"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Result is Check's verdict with why, for a log line or the idem-error
// header of a dead-lettered record.
type Result struct {
	Status Status
	// Reason says why in one line; empty when Live.
	Reason string
	// Deadline is the parsed deadline header, zero when absent or invalid.
	Deadline time.Time
	// Limited is set on a Live verdict when a deadline or a maximum age
	// applies to the record: a later Check may find it Expired. A Live
	// verdict without it stays Live whatever the clock says.
	Limited bool
}

// maxShown caps how much of a bad header value a Reason quotes.
const maxShown = 64

// Check decides whether a record with timestamp ts and headers may be
// handled at now.
//
//  1. The deadline header (the last one named header), when present, must
//     parse (ParseDeadline), or the verdict is InvalidHeader, whatever the
//     age; a record is Expired when now is after its deadline.
//  2. With maxAge > 0, a record is Expired when now - ts > maxAge. A zero
//     ts (a record without a timestamp) has no age and never expires by
//     age; a ts in the future (a producer's clock ahead) has a negative
//     age and does not either.
//
// Otherwise it is Live. An empty header name checks no header.
func Check(ts time.Time, headers []handler.Header, header string, maxAge time.Duration, now time.Time) Result {
	var deadline time.Time
	if v, ok := last(headers, header); ok {
		d, err := ParseDeadline(v)
		if err != nil {
			return Result{Status: InvalidHeader, Reason: fmt.Sprintf("header %s: %v", header, err)}
		}
		deadline = d
		if now.After(d) {
			return Result{Status: Expired, Deadline: d, Reason: fmt.Sprintf("deadline %s (header %s) passed %s before %s",
				d.UTC().Format(time.RFC3339Nano), header, now.Sub(d), now.UTC().Format(time.RFC3339Nano))}
		}
	}
	if maxAge > 0 && !ts.IsZero() {
		if age := now.Sub(ts); age > maxAge {
			return Result{Status: Expired, Deadline: deadline, Reason: fmt.Sprintf("record timestamp %s is %s old, over the max age %s",
				ts.UTC().Format(time.RFC3339Nano), age, maxAge)}
		}
	}
	return Result{Status: Live, Deadline: deadline, Limited: !deadline.IsZero() || maxAge > 0 && !ts.IsZero()}
}

// HasHeader reports whether headers carry name: without it, and with no
// maximum age, Check's verdict is Live whatever the clock says, so a caller
// on a hot path can skip reading the clock.
func HasHeader(headers []handler.Header, name string) bool {
	_, ok := last(headers, name)
	return ok
}

func last(headers []handler.Header, name string) ([]byte, bool) {
	if name == "" {
		return nil, false
	}
	for i := len(headers) - 1; i >= 0; i-- {
		if headers[i].Key == name {
			return headers[i].Value, true
		}
	}
	return nil, false
}

// maxUnixMillis is the largest deadline in unix milliseconds ParseDeadline
// accepts: the end of year 9999, as for RFC 3339.
var maxUnixMillis = time.Date(9999, 12, 31, 23, 59, 59, 999e6, time.UTC).UnixMilli()

// ParseDeadline reads a deadline header's value: unix milliseconds in
// decimal digits (no sign, no spaces; "0" is 1970-01-01), or RFC 3339 with
// a zone ("2026-01-01T00:00:00Z", "2026-01-01T01:00:00.5+01:00"). Anything
// else is an error that quotes the value (at most 64 bytes of it).
func ParseDeadline(v []byte) (time.Time, error) {
	s := string(v)
	if s == "" {
		return time.Time{}, errors.New("empty value: want unix milliseconds or an RFC 3339 time")
	}
	if strings.Trim(s, "0123456789") == "" {
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil || ms > maxUnixMillis {
			return time.Time{}, fmt.Errorf("%s: unix milliseconds after year 9999", quote(s))
		}
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s is not a time: want unix milliseconds or RFC 3339 (2006-01-02T15:04:05Z)", quote(s))
	}
	return t, nil
}

// quote quotes at most maxShown bytes of s, cut at a rune boundary.
func quote(s string) string {
	if len(s) <= maxShown {
		return strconv.Quote(s)
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + fmt.Sprintf("… (%d bytes)", len(s))
}

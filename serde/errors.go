package serde

import (
	"fmt"
	"strconv"
	"strings"
)

// UnavailableError reports that the schema registry cannot serve the
// request now: it refused the connection, timed out, answered 5xx, or
// refused this client (401, 403, 429). No record is to blame, so a record
// that needed the registry must wait for it, not be retried against its
// budget or dead-lettered.
//
// It wraps a *breaker.OpenError (the Registry's own breaker, named
// "schema-registry"), so breaker.IsOpen holds for it and
// breaker.RetryAfter says when to try again: consumer.Run treats an error
// of a handler that wraps one as a dependency that is down: it rolls back,
// spends no attempt, forwards nothing and pauses the partitions for
// RetryAfter, then probes with the same record. Recognise it with
// errors.As(err, new(*serde.UnavailableError)).
type UnavailableError struct {
	URL string // the registry's URL (RegistryConfig.URL)
	Op  string // what was asked, e.g. `schema id 7`
	Err error  // a *breaker.OpenError whose Cause is the request's failure
}

// Error describes the outage in one line.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("serde: schema registry %s unavailable (%s): %v", e.URL, e.Op, e.Err)
}

// Unwrap returns Err.
func (e *UnavailableError) Unwrap() error { return e.Err }

// DecodeError reports a record, or a schema, that cannot be read: a value
// not in Confluent's wire format (wrong magic byte, too short), a schema id
// or subject the registry does not know, a payload that does not decode
// with its writer's schema (truncated, corrupt), a Protobuf message index
// the schema does not have, a writer's schema the reader's cannot resolve,
// a JSON document its JSON Schema rejects. Codecs return it wrapped in
// handler.Decode, so consumer.Run dead-letters the record at once (kind
// "decode") with its bytes unchanged. SchemaID and Subject say which schema,
// when known, for the dead letter's headers: the id the record names, and a
// subject the registry lists for that id (asked once per id, only when a
// record fails to decode; "" when the registry does not say).
type DecodeError struct {
	SchemaID int    // the id the record names; 0 when the header is unreadable
	Subject  string // the subject, when the schema was looked up by one
	Err      error  // what went wrong
}

// Error describes the failure in one line, naming the schema.
func (e *DecodeError) Error() string {
	var where []string
	if e.SchemaID != 0 {
		where = append(where, "schema id "+strconv.Itoa(e.SchemaID))
	}
	if e.Subject != "" {
		where = append(where, "subject "+strconv.Quote(e.Subject))
	}
	if len(where) == 0 {
		return "serde: " + e.Err.Error()
	}
	return "serde: " + strings.Join(where, ", ") + ": " + e.Err.Error()
}

// Unwrap returns Err.
func (e *DecodeError) Unwrap() error { return e.Err }

// SchemaRef returns SchemaID and Subject: a consumer that writes them into a
// dead letter's headers finds them with
// errors.As(err, new(interface{ SchemaRef() (int, string) })), without
// importing serde.
func (e *DecodeError) SchemaRef() (id int, subject string) { return e.SchemaID, e.Subject }

package failidx

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/internal/seal"
)

// Status is the state of an indexed dead letter. A record enters the index
// Unresolved; Replay and EditAndRetry claim it (Replaying) and, once it is
// published, make it Replayed; Resolve makes it Resolved and Archive
// Archived. Each change records who made it, when and why.
type Status string

// The statuses of a Record.
const (
	// Unresolved: nobody has dealt with the record yet. Only unresolved
	// records count in idem_dlq_unresolved and are replayed.
	Unresolved Status = "unresolved"
	// Replaying: a replay or an edit-and-retry job claimed the record and is
	// publishing it (or waits to be resumed, see RunJob). It goes on to
	// Replayed, or back to Unresolved when the job is cancelled or fails.
	// idem_dlq_unresolved counts it with the unresolved records.
	Replaying Status = "replaying"
	// Replayed: the record was sent back (to its origin topic or a tier),
	// as it was or edited. If it fails again, the new failure is indexed as
	// a new record whose PreviousID points at this one.
	Replayed Status = "replayed"
	// Resolved: an operator marked it dealt with, nothing was sent.
	Resolved Status = "resolved"
	// Archived: an operator set it aside, with a reason (required).
	Archived Status = "archived"
)

// Valid reports whether s is one of the five statuses.
func (s Status) Valid() bool {
	switch s {
	case Unresolved, Replaying, Replayed, Resolved, Archived:
		return true
	}
	return false
}

// Record is one indexed dead letter, unique by (Topic, Partition, Offset) of
// the DLQ record.
type Record struct {
	// ID is the record's id in the index (what actions take).
	ID int64
	// Topic, Partition and Offset locate the record in its dead-letter topic.
	Topic     string
	Partition int32
	Offset    int64
	// OriginTopic, OriginPartition and OriginOffset locate the record where
	// it was first consumed (idem-original-*).
	OriginTopic     string
	OriginPartition int32
	OriginOffset    int64
	// Group is the consumer group that failed (idem-consumer-group);
	// Fingerprint groups records failing the same way, as `idem dlq list`
	// computes it (dlq.Record.Fingerprint); Kind is idem-error-kind.
	Group, Fingerprint, Kind string
	// Key is the Kafka key (nil for none).
	Key []byte
	// IdempotencyKey is the key idem derived: header idem-idempotency-key,
	// else idempotency-key; "" when neither is present.
	IdempotencyKey string
	// Attempts is idem-attempt: deliveries to a handler before the DLQ.
	Attempts int
	// FirstFailureAt and LastFailureAt are idem-first-failure-at and
	// idem-last-failure-at (the DLQ record's timestamp when missing).
	FirstFailureAt, LastFailureAt time.Time
	// IndexedAt is when the indexer stored the record.
	IndexedAt time.Time
	// Error, ErrorType and Stack are idem-error, idem-error-type and
	// idem-stack.
	Error, ErrorType, Stack string
	// Value is a copy of the record's value, capped at the indexer's
	// MaxValueBytes (ValueTruncated then says so); nil for a tombstone or a
	// stub. ValueSize is the size of the value in Kafka; for a stub, the
	// size of the value that was omitted (idem-payload-omitted).
	Value          []byte
	ValueSize      int
	ValueTruncated bool
	// Stub says the record is a dead-letter stub: its value was left out
	// because no topic would take it whole. A stub is never replayed.
	Stub bool
	// Headers are all the record's headers, in order.
	Headers []Header
	// Status is the record's state, with who changed it last (StatusActor),
	// why (StatusReason) and when (StatusAt; for Unresolved, IndexedAt).
	Status                    Status
	StatusActor, StatusReason string
	StatusAt                  time.Time
	// PreviousID is the earlier failure this one repeats (0: none): the
	// record its idem-replay-of header names (dlq.Record.ReplayedFrom; written by
	// every replay and edit-and-retry and kept by the consumer's forwards)
	// when the index holds it; else the latest record indexed before it with
	// the same idempotency key, origin topic and group. A replayed record
	// that fails again links back this way.
	PreviousID int64
	// Versions are the edits made by EditAndRetry, oldest first. Filled by
	// Get only.
	Versions []Version
	// KeyID is the data key (internal/seal) that seals Value and Headers at
	// rest; 0 when they are stored in clear.
	KeyID int64
	// PayloadErr, when not nil, says why Value and Headers (then nil) could
	// not be read: the data key was destroyed (errors.Is(err,
	// seal.ErrKeyDestroyed)), the sealed bytes do not authenticate
	// (seal.ErrTampered), the store has no key-encryption key that unwraps
	// the data key (seal.ErrWrongKEK, ErrNoEncryptionKey). The rest of the
	// record is there. Such a record is never replayed.
	PayloadErr error

	sealed *sealedPayload // the sealed bytes until Store.open opens them
}

// Header is one Kafka record header.
type Header = seal.Header

// Version is one edit of a record made by EditAndRetry: the value that was
// published, never overwriting the original (Record.Value).
type Version struct {
	// N numbers the versions of a record from 1.
	N int
	// Value is the edited value as published.
	Value []byte
	// Actor and Reason say who edited it and why; At when.
	Actor, Reason string
	At            time.Time
	// PublishedTo, PublishedPartition and PublishedOffset locate the
	// published record; PublishedTo is "" (and PublishedOffset -1) while
	// the edit's job has not published it yet.
	PublishedTo        string
	PublishedPartition int32
	PublishedOffset    int64
	// KeyID and PayloadErr are Record's, for Value.
	KeyID      int64
	PayloadErr error
}

// Filter selects records for List, Groups and actions. A zero Filter matches
// every record; each set field must match (AND).
type Filter struct {
	// Group, Topic (the DLQ topic) and Kind match exactly; Fingerprint
	// (hexadecimal) matches exactly when it has all 12 digits, else by
	// prefix.
	Group, Topic, Kind, Fingerprint string
	// Key matches the IdempotencyKey or the Kafka key exactly.
	Key string
	// ErrorContains matches the error text anywhere, case-insensitively.
	ErrorContains string
	// Status keeps records in any of these statuses; empty: any status.
	Status []Status
	// Since and Until bound LastFailureAt: Since <= t < Until; zero: open.
	Since, Until time.Time
	// Partition and Offset, when HasOffset, select the record at that
	// position (with Topic: the one record there; for the CLI's
	// --partition/--offset). Ignored when HasOffset is false.
	Partition int32
	Offset    int64
	HasOffset bool
}

// Page is one page of List: Records in order (latest failure first), and
// Next, the opaque cursor of the next page ("" on the last page).
type Page struct {
	Records []Record
	Next    string
}

// FailureGroup is the records of one DLQ topic and group that failed the same
// way (same Fingerprint and Kind).
type FailureGroup struct {
	Fingerprint, Kind, Group, Topic string
	// SampleError is the error of the group's latest record, SampleID that
	// record's id (0 when not known: a group counted before the index kept
	// it, or whose sample was swept).
	SampleError string
	SampleID    int64
	// Count is how many records match the filter; Unresolved how many of
	// them are unresolved.
	Count, Unresolved int
	// FirstSeen and LastSeen span the records' LastFailureAt.
	FirstSeen, LastSeen time.Time
}

// TopicSummary is the overview of one group and DLQ topic.
type TopicSummary struct {
	Group, Topic string
	// Unresolved counts the unresolved records.
	Unresolved int
	// OldestUnresolved is the LastFailureAt of the oldest unresolved record;
	// zero when none.
	OldestUnresolved time.Time
	// ArrivalsLastHour counts records whose LastFailureAt is in the last hour.
	ArrivalsLastHour int
}

// AuditEntry is one row of the audit table: one action by one actor.
type AuditEntry struct {
	ID     int64
	At     time.Time
	Actor  string
	Action string // replay, resolve, archive, edit-retry, reveal, release-key, retry-outbox, …
	// RecordIDs are the records (or outbox rows) acted on.
	RecordIDs []int64
	// Detail says how: target topic, rate, filter, …
	Detail string
	Reason string
	// Result is "ok: …" or the error.
	Result string
}

// Selection picks records for an action: explicit IDs, or every record
// matching Filter (with Filter.Fingerprint for a whole group). Exactly one of
// the two must be set.
type Selection struct {
	IDs    []int64
	Filter *Filter
}

// Result counts what an action did.
type Result struct {
	// Matched is how many records the selection picked.
	Matched int
	// Done is how many were replayed, resolved, archived, released or retried.
	Done int
	// Skipped is how many were left alone: stubs, and records whose status
	// the action does not apply to (see each action).
	Skipped int
	// SkippedStubs are the ids of stubs a replay left alone.
	SkippedStubs []int64
	// Errors describe records that could not be dealt with (for example a
	// truncated value whose record has expired from Kafka).
	Errors []string
}

// ParkedKey is one key ByKey ordering holds blocked.
type ParkedKey struct {
	Group, Topic string
	// Key is the Kafka key (raw bytes in a string).
	Key string
	// Parked counts the messages parked behind the head.
	Parked int
	// Head is the idempotency key of the message the key waits for ("" when
	// only parked rows are left).
	Head string
	// Since is when the oldest message was parked (or the head became the
	// head when nothing is parked).
	Since time.Time
}

// OutboxRow is one failed row of the outbox table idem_outbox.
type OutboxRow struct {
	ID                int64
	Topic, Key, Error string
	Attempts          int
	CreatedAt         time.Time
}

// ErrNotFound is returned (wrapped) by Get and by actions given an id that is
// not in the index.
var ErrNotFound = errors.New("index: record not found")

// ValidationError reports bad input to an action: nothing was changed or
// published.
type ValidationError struct {
	// Field names the input at fault: "reason", "value", "to", "ids", …
	Field string
	Msg   string
}

// Error describes the bad input in one line.
func (e *ValidationError) Error() string { return fmt.Sprintf("index: %s: %s", e.Field, e.Msg) }

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ErrConflict is returned (wrapped) by EditAndRetry when the record is not
// unresolved: replayed, resolved, archived, or being replayed by another
// action. Nothing was published or changed.
var ErrConflict = errors.New("index: record is not unresolved")

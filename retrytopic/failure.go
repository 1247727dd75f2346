package retrytopic

import (
	"time"

	"github.com/idemhq/idem/handler"
)

// Failure is what the idem-* headers of a forwarded record say (DESIGN.md's
// wire contract); dlq.Record.Failure holds it for a dead-lettered record. Zero
// times and empty strings are not written, and read back as zero values.
type Failure struct {
	// Attempt counts the deliveries of the message to a handler so far,
	// including in-process retries and earlier tiers (handler.Message.Attempt).
	Attempt int
	// Tier is the retry tier (1…) the record was sent to, 0 for the
	// dead-letter topic.
	Tier int
	// DueAt is when the record may be handled again; zero for the DLQ.
	DueAt time.Time
	// OriginalTopic, OriginalPartition, OriginalOffset and OriginalTimestamp
	// locate the record where it was first consumed. They survive every
	// forward unchanged.
	OriginalTopic     string
	OriginalPartition int32
	OriginalOffset    int64
	OriginalTimestamp time.Time
	// Group is the consumer group that failed to handle the record.
	Group string
	// Error is the error message, Kind its class, ErrorType the Go type of
	// the error under handler's own markers (handler.Permanent(&net.OpError{…})
	// gives "*net.OpError"), Stack the panic stack if any.
	Error     string
	Kind      handler.Kind
	ErrorType string
	Stack     []byte
	// FirstFailureAt is when the record first failed (survives forwards);
	// LastFailureAt when it failed this time.
	FirstFailureAt time.Time
	LastFailureAt  time.Time
	// Stub says the record is a dead-letter stub: the destination refused the
	// whole record for good (too large, not authorised, invalid), so it was
	// dead-lettered with its key and headers but a nil value. OmittedBytes is
	// the size of the value left out. Both are written as
	// idem-payload-omitted, present only on stubs.
	Stub         bool
	OmittedBytes int
	// OmittedHeaders counts the record's own headers left out of a
	// last-resort stub: the dead-letter topic refused even the stub with
	// them (their size alone is over its limit), so only idem's headers are
	// kept. Written as idem-headers-omitted, present only then.
	OmittedHeaders int
	// ForwardError is the producer error that made the record go somewhere
	// else than planned (a dead-letter topic instead of a tier, or a stub
	// instead of the whole record); empty otherwise.
	ForwardError string
	// IdempotencyKey is the key the consumer derived for the record (from a
	// header, a JSON field, …: Config.KeyFunc), the one its inbox row holds,
	// so tools need not derive it again; empty when the record had none (a
	// missing or invalid key).
	IdempotencyKey string
	// SchemaID and SchemaSubject name the schema registry schema of a
	// record whose value did not decode (a handler.Decode error naming it,
	// such as serde's *DecodeError): the id its value names (0 when the
	// value is not in the registry's wire format) and a subject of it (""
	// when the registry did not say). Written as idem-schema-id and
	// idem-schema-subject, present only then.
	SchemaID      int
	SchemaSubject string
}

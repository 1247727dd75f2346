package index

import (
	"context"
	"errors"

	"github.com/IBM/sarama"
)

// HeaderReplaces is the header EditAndRetry adds to the record it publishes:
// the DLQ record it replaces, as "<topic>/<partition>/<offset>".
const HeaderReplaces = "idem-replaces"

// Actions change the index and publish to Kafka on an operator's behalf. Every
// action writes one AuditEntry (who, what, which records, why, the result),
// also when it fails. It is safe for concurrent use.
type Actions struct {
	store  *Store
	client sarama.Client
}

// NewActions returns Actions on s that publish through client. client must be
// set up for producing as retrytopic.ConfigureProducer describes, with
// Metadata.AllowAutoTopicCreation = false (ProducerConfig does both); the
// caller keeps owning it. client may be nil for Resolve, Archive and the
// outbox actions; Replay, EditAndRetry and ReleaseKey then fail.
func NewActions(s *Store, client sarama.Client) *Actions { return &Actions{store: s, client: client} }

// Replay sends the selected unresolved records back: to each record's origin
// topic (to == "") as a fresh record without idem-* headers, or to the topic
// named by to (typically a retry tier), keeping the idem-* history, due now.
// Key, value and original headers (idempotency key included) are kept byte
// for byte, so a record that was in fact handled is a duplicate the
// consumer's inbox drops. ratePerSec > 0 paces the sends. Each record sent is
// marked Replayed (actor, reason); records not selected stay as they are.
//
// Stubs are never replayed: they are counted in Result.SkippedStubs. Records
// that are not unresolved are skipped (Result.Skipped). Every destination is
// checked before anything is sent: a topic that does not exist is an error
// (wrapping dlq.ErrUnknownTopic) and nothing is published or changed. An id
// that is not in the index is an error wrapping ErrNotFound, before anything
// is sent.
func (a *Actions) Replay(ctx context.Context, actor string, sel Selection, to string, ratePerSec int, reason string) (Result, error) {
	return Result{}, errors.New("index: not implemented")
}

// Resolve marks the selected unresolved or replayed records Resolved.
// Archived and resolved records are skipped.
func (a *Actions) Resolve(ctx context.Context, actor string, sel Selection, reason string) (Result, error) {
	return Result{}, errors.New("index: not implemented")
}

// Archive marks the selected records Archived. reason is required (a
// *ValidationError otherwise, nothing changed). Archived records are skipped.
func (a *Actions) Archive(ctx context.Context, actor string, sel Selection, reason string) (Result, error) {
	return Result{}, errors.New("index: not implemented")
}

// EditAndRetry publishes value in place of record id's value to the record's
// origin topic, with its Kafka key and original headers (so under the same
// idempotency key) and header idem-replaces = "<topic>/<partition>/<offset>"
// of the DLQ record. value must be valid JSON when the original was JSON, and
// must keep every JSON string field that held the idempotency key; otherwise,
// or when value is empty, the error is a *ValidationError and nothing is
// published or changed. The edit is stored as a new Version beside the
// original value, which is never overwritten, and the record is marked
// Replayed. An unknown id is an error wrapping ErrNotFound.
func (a *Actions) EditAndRetry(ctx context.Context, actor string, id int64, value []byte, reason string) (Result, error) {
	return Result{}, errors.New("index: not implemented")
}

// ParkedKeys returns up to limit keys OrderingByKey holds blocked, every group
// and topic (none when the ordering tables do not exist).
func (a *Actions) ParkedKeys(ctx context.Context, limit int) ([]ParkedKey, error) {
	return nil, errors.New("index: not implemented")
}

// ReleaseKey gives up the ordering of key in group and topic, as `idem
// ordering release --to source` does: the head's pending forward and every
// parked message go back to the source topic, in order, as fresh records.
func (a *Actions) ReleaseKey(ctx context.Context, actor, group, topic, key, reason string) (Result, error) {
	return Result{}, errors.New("index: not implemented")
}

// FailedOutbox returns up to limit outbox rows (idem_outbox) in the failed
// state, lowest id first (none when the table does not exist).
func (a *Actions) FailedOutbox(ctx context.Context, limit int) ([]OutboxRow, error) {
	return nil, errors.New("index: not implemented")
}

// RetryOutbox makes the failed outbox rows ids pending again (outbox.Retry).
// Rows that are not failed are skipped.
func (a *Actions) RetryOutbox(ctx context.Context, actor string, ids []int64, reason string) (Result, error) {
	return Result{}, errors.New("index: not implemented")
}

package tables

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// ErrInvalidDeferred is wrapped by the error Defer returns for a record it
// refuses (no transaction, no group, no topic, an empty header name, a due
// time too far away); nothing is inserted then.
var ErrInvalidDeferred = errors.New("schedule: invalid record")

// DeferredRecord is one message to publish again later: what a consumer stores when
// its handler returns handler.DeferUntil.
type DeferredRecord struct {
	// Group is the consumer group whose schedule.Scheduler publishes the record (one
	// leader per group). Required.
	Group string
	// Topic is where the record is published when due. Required. The
	// scheduler never creates topics: a missing topic is an outage, waited
	// out (see schedule.Scheduler, "Failures").
	Topic string
	// Partition is the partition the message was read from. It is used
	// again in Topic when Topic has that many partitions; otherwise the
	// partition is chosen by hashing Key (sarama's hash partitioner), as
	// idem's forwards to retry tiers do.
	Partition int32
	// Key and Value are published byte for byte; nil stays nil.
	Key, Value []byte
	// Headers are published as given, in order. To be handled as the same
	// message, they must let the consumer derive the same idempotency key
	// (the idempotency-key header, by default) and carry the origin
	// (the wire contract's idem-original-* headers): RecordOf builds
	// both from a handler.Message.
	Headers []sarama.RecordHeader
	// Timestamp is the published record's timestamp. Default: zero, the
	// producer's clock at publication.
	Timestamp time.Time
	// IdempotencyKey and Origin describe the message for operators (`idem
	// schedule list`); they are stored in columns of their own and not
	// published (the headers carry what the consumer reads).
	IdempotencyKey string
	Origin         handler.Origin
	// DLQ is the dead-letter topic the scheduler sends a stub of the
	// message to when its payload, sealed at rest, cannot be opened for good
	// (its data key destroyed): the consumer's dead-letter topic for the
	// origin. Default: "" (retrytopic's default name for Origin.Topic and
	// Group).
	DLQ string
}

// DeferredPurpose is the internal/seal purpose of the data keys that seal deferred
// messages (consumer.Config.EncryptionKeyFile).
const DeferredPurpose = "deferred"

// DeferredAAD binds a deferred row's sealed payload to the message it holds.
func DeferredAAD(group, topic string, partition int32, idempotencyKey string, origin handler.Origin) []byte {
	return seal.AAD("idem_deferred", group, topic, strconv.Itoa(int(partition)), idempotencyKey,
		origin.Topic, strconv.Itoa(int(origin.Partition)), strconv.FormatInt(origin.Offset, 10))
}

// DeferredRecordOf is the Record a consumer of group stores when its handler defers
// m, to be published to topic: m's partition number (its origin's), key and
// value (shared with m, not copied: call Defer before the handler's message
// is released), and headers that keep m's own (its idempotency-key among
// them) and carry where it was first consumed: the wire contract's
// idem-* headers with the origin, the attempt count, the group and the idempotency key, which drops
// the idem-* headers of an earlier forward (a retry tier's due time, error
// and tier). The copy is therefore read as the same message, from the same
// origin, with no failure attached.
func DeferredRecordOf(group, topic string, m *handler.Message) DeferredRecord {
	o := m.Origin()
	return DeferredRecord{
		Group: group, Topic: topic, Partition: o.Partition,
		Key: m.Key, Value: m.Value,
		Headers: wire.Encode(m.Headers, retrytopic.Failure{
			Attempt: m.Attempt, Group: group, IdempotencyKey: m.IdempotencyKey,
			OriginalTopic: o.Topic, OriginalPartition: o.Partition, OriginalOffset: o.Offset, OriginalTimestamp: o.Timestamp,
		}),
		IdempotencyKey: m.IdempotencyKey,
		Origin:         o,
	}
}

// maxAhead bounds how far Defer accepts a due time: handler.MaxDefer, plus a
// day for a handler that ran long or a clock that differs.
const maxAhead = handler.MaxDefer + 24*time.Hour

// Defer inserts rec into idem_deferred in the caller's transaction tx, to be
// published by rec.Group's schedule.Scheduler at at (compared with the database's
// now(), so every scheduler agrees; a zero or past at means as soon as
// possible). The row exists only if tx commits. The consumer inserts it
// (the handler's transaction was rolled back) together with a record of the
// deferral in its inbox, and marks the message's offset after both commit:
// a redelivery in between finds the record and defers nothing again
// (consumer's TestCrossingRedeliveredDeferralIsStoredOnce). Only when the
// inbox is in another database than tx's (or not in PostgreSQL) are the two
// committed one after the other, and a crash between them defers the
// message twice: both copies are published, and the inbox turns the second
// into a duplicate.
//
// at is absolute: with time.Now().Add(d) a skew between the application's
// clock and the database's shifts it. Defer refuses (ErrInvalidRecord) a nil
// tx, an empty Group or Topic, a header with an empty name, text that
// PostgreSQL cannot store (Group, Topic, IdempotencyKey, Origin.Topic or a
// header name that is not UTF-8 or holds a NUL), and an at more than
// handler.MaxDefer plus a day ahead of this process's clock.
//
// With a sealer sl (consumer.Config.EncryptionKeyFile), the value and
// headers are sealed as one blob under sl's current data key, in tx, and
// the value and header columns are left empty; nil stores them in clear.
func Defer(ctx context.Context, tx pgx.Tx, rec DeferredRecord, at time.Time, sl *seal.Sealer) error {
	if err := rec.validate(at, time.Now()); err != nil {
		return err
	}
	if tx == nil {
		return fmt.Errorf("%w: nil transaction (pass the transaction that settles the message)", ErrInvalidDeferred)
	}
	keys := make([]string, len(rec.Headers))
	vals := make([][]byte, len(rec.Headers))
	for i, h := range rec.Headers {
		keys[i] = string(h.Key)
		vals[i] = h.Value
		if vals[i] == nil {
			vals[i] = []byte{}
		}
	}
	var keyID *int64
	var sealed []byte
	if sl != nil {
		hs := make([]seal.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			hs[i] = seal.Header{Key: h.Key, Value: h.Value}
		}
		ct, id, err := sl.Seal(ctx, tx, seal.Pack(rec.Value, hs), DeferredAAD(rec.Group, rec.Topic, rec.Partition, rec.IdempotencyKey, rec.Origin))
		if err != nil {
			return fmt.Errorf("schedule: defer a record of group %s to %s: %w", rec.Group, rec.Topic, err)
		}
		keyID, sealed = &id, ct
		rec.Value, keys, vals = nil, []string{}, [][]byte{}
	}
	var until, ts *time.Time
	if !at.IsZero() {
		until = &at
	}
	if !rec.Timestamp.IsZero() {
		ts = &rec.Timestamp
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+DeferredTable+` (consumer_group, topic, partition, key, value, header_keys, header_values,
		record_timestamp, idempotency_key, origin_topic, origin_partition, origin_offset, deferred_until, due_at,
		key_id, sealed, dlq_topic)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, coalesce($13, now()), coalesce($13, now()), $14, $15, $16)`,
		rec.Group, rec.Topic, rec.Partition, rec.Key, rec.Value, keys, vals, ts,
		rec.IdempotencyKey, rec.Origin.Topic, rec.Origin.Partition, rec.Origin.Offset, until, keyID, sealed, rec.DLQ)
	if err != nil {
		return fmt.Errorf("schedule: defer a record of group %s to %s: %w", rec.Group, rec.Topic, err)
	}
	return nil
}

func (rec DeferredRecord) validate(at, now time.Time) error {
	switch {
	case rec.Group == "":
		return fmt.Errorf("%w: no Group (the consumer group whose scheduler publishes it)", ErrInvalidDeferred)
	case rec.Topic == "":
		return fmt.Errorf("%w: group %s: no Topic to publish to", ErrInvalidDeferred, rec.Group)
	case !at.IsZero() && at.Sub(now) > maxAhead:
		return fmt.Errorf("%w: group %s, topic %s: due at %s, more than %s ahead (handler.MaxDefer plus a day)",
			ErrInvalidDeferred, rec.Group, rec.Topic, at.UTC().Format(time.RFC3339), maxAhead)
	}
	for _, f := range []struct{ name, v string }{{"Group", rec.Group}, {"Topic", rec.Topic},
		{"IdempotencyKey", rec.IdempotencyKey}, {"Origin.Topic", rec.Origin.Topic}} {
		if !isText(f.v) {
			return fmt.Errorf("%w: %s %q is not valid UTF-8 without NUL (PostgreSQL text)", ErrInvalidDeferred, f.name, f.v)
		}
	}
	for i, h := range rec.Headers {
		switch {
		case len(h.Key) == 0:
			return fmt.Errorf("%w: group %s, topic %s: header %d has an empty name", ErrInvalidDeferred, rec.Group, rec.Topic, i)
		case !isText(string(h.Key)):
			return fmt.Errorf("%w: group %s, topic %s: header %d name %q is not valid UTF-8 without NUL", ErrInvalidDeferred, rec.Group, rec.Topic, i, h.Key)
		}
	}
	return nil
}

// isText reports whether s can be stored in a PostgreSQL text column.
func isText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

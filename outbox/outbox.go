package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/seal"
)

// defaultTable is the outbox table used when no table is named: idem_outbox.
const defaultTable = outboxstore.Table

// HeaderIdempotencyKey is idem's default consumer key header. The relay
// sets it to the row's event id (also published as header idem-outbox-id)
// unless the message already has one, so idem consumers downstream drop
// relay duplicates with no extra code.
const HeaderIdempotencyKey = "idempotency-key"

// ErrInvalidMessage is wrapped by the error Enqueue returns for a message it
// refuses (empty topic, empty header name); nothing is inserted then.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// ErrInvalidConfig is matched by errors about a bad table name and by every
// problem Relay.Validate reports; each names the field, the value and the rule.
var ErrInvalidConfig = outboxstore.ErrInvalidConfig

// Message is one event to publish.
type Message struct {
	// Topic is the Kafka topic to publish to. Required. The relay never
	// creates topics: a row for a topic that does not exist (yet) waits,
	// holding back its key, until the topic is created; it is an outage,
	// not bad input, and never fails the row.
	Topic string
	// Key is the Kafka record key (nil for none). It chooses the partition
	// (sarama's hash partitioner) and the ordering group: rows of one key are
	// published in id order, each only after the one before it was acked.
	// Rows with a nil key are not ordered among themselves.
	Key []byte
	// Value is the record value (nil for a tombstone).
	Value []byte
	// Headers are published as given (values byte for byte), followed by
	// idem-outbox-id and, when no header idempotency-key is given,
	// idempotency-key = the event id.
	Headers []handler.Header
	// NotBefore, when set, is the earliest time the relay publishes the
	// row, compared with the database's clock (now()) so that every relay
	// agrees; it is stored as timestamptz (microseconds). A time already
	// past means as soon as possible. The time is absolute: with
	// time.Now().Add(d), a skew between the application's clock and the
	// database's shifts it. The relay wakes for the earliest NotBefore by a
	// timer, without polling (see Relay, "Delayed rows"). Enqueue refuses a
	// time outside PostgreSQL's timestamptz range (4713 BC to 294276 AD).
	//
	// Per-key order still holds: a key's rows are published in enqueue
	// order, so a delayed row holds back the later rows of its key until it
	// is published, even rows due earlier or not delayed at all, while the
	// rows enqueued before it and other keys flow on; a keyless delayed row
	// holds back nothing. Use another key (or none) for an event that must
	// not wait for the delayed one.
	// Default: zero, publish as soon as possible.
	NotBefore time.Time
}

// Enqueue inserts msgs into the default outbox table (idem_outbox) in the
// caller's transaction tx, in one round trip. They become visible to the
// relay, and are published, only if tx commits; a rollback discards them
// with the rest of the transaction. Inside an idem handler pass
// dedupe.Tx(ctx), in per-message and in batch mode alike: the events then
// commit with the inbox row and the handler's writes, or not at all.
//
// Each row gets an increasing id (its order) and a random event id (UUID)
// that the relay publishes as header idem-outbox-id and, unless the message
// sets one, as idempotency-key. For another table, or to seal the payloads
// at rest, use Relay.Enqueue.
//
// Enqueue also stores what ctx says about where the event comes from, as
// headers of each message that does not set them itself: the trace context
// of ctx's span (W3C traceparent and tracestate, and what else the global
// OpenTelemetry propagator writes; inside an idem handler, the span of the
// message's attempt), and the correlation id (header idem-correlation-id,
// see WithCorrelationID). The relay publishes the record in a
// span that continues that trace, so the handler, the publish and the next
// consumer of the event are one trace.
func Enqueue(ctx context.Context, tx pgx.Tx, msgs ...Message) error {
	return enqueue(ctx, tx, defaultTable, nil, msgs)
}

// enqueue is Enqueue into table (optionally "schema.table", as for
// Relay.Table), sealing each message's value and headers with sl when it
// is not nil (Relay.Enqueue).
func enqueue(ctx context.Context, tx pgx.Tx, table string, sl *seal.Sealer, msgs []Message) error {
	if len(msgs) == 0 {
		return nil
	}
	t, err := parseTable(table)
	if err != nil {
		return err
	}
	if tx == nil {
		return fmt.Errorf("%w: nil transaction (inside an idem handler use dedupe.Tx(ctx) with dedupe.NewPostgres)", ErrInvalidMessage)
	}
	var key *seal.Key
	if sl != nil {
		if key, err = sl.Current(ctx, tx); err != nil {
			return fmt.Errorf("outbox: enqueue into %s: %w", t.quoted, err)
		}
	}
	// A future not_before is also the row's first retry_at: the relay reads
	// no row before its retry_at and holds back the later rows of its key.
	q := "INSERT INTO " + t.quoted + ` (topic, key, value, header_keys, header_values, not_before, retry_at, event_id, key_id, sealed)
		VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $6::timestamptz > now() THEN $6::timestamptz END,
			coalesce($7::uuid, gen_random_uuid()), $8, $9)`
	b := &pgx.Batch{}
	fromCtx := contextHeaders(ctx)
	for i, m := range msgs {
		if m.Topic == "" {
			return fmt.Errorf("%w: message %d has no Topic", ErrInvalidMessage, i)
		}
		keys := make([]string, 0, len(m.Headers)+len(fromCtx))
		vals := make([][]byte, 0, len(m.Headers)+len(fromCtx))
		for _, h := range withContextHeaders(m, fromCtx) {
			if h.Key == "" {
				return fmt.Errorf("%w: message %d (topic %s) has a header with an empty name", ErrInvalidMessage, i, m.Topic)
			}
			keys = append(keys, h.Key)
			vals = append(vals, nonNil(h.Value))
		}
		if y := m.NotBefore.Year(); y < -4712 || y > 294275 {
			return fmt.Errorf("%w: message %d (topic %s) has NotBefore %s, outside PostgreSQL's timestamptz range (4713 BC to 294276 AD)",
				ErrInvalidMessage, i, m.Topic, m.NotBefore)
		}
		var notBefore *time.Time
		if !m.NotBefore.IsZero() {
			notBefore = &m.NotBefore
		}
		var eventID *string
		var keyID *int64
		var sealed []byte
		value := m.Value
		if key != nil { // sealed: the event id is made here, to bind the payload to its row
			id, err := newEventID()
			if err != nil {
				return fmt.Errorf("outbox: enqueue into %s: %w", t.quoted, err)
			}
			hs := make([]seal.Header, len(keys))
			for i := range keys {
				hs[i] = seal.Header{Key: []byte(keys[i]), Value: vals[i]}
			}
			kid := key.ID()
			eventID, keyID, sealed = &id, &kid, key.Seal(seal.Pack(m.Value, hs), outboxstore.AAD(t.name, id))
			value, keys, vals = nil, []string{}, [][]byte{}
		}
		b.Queue(q, m.Topic, m.Key, value, keys, vals, notBefore, eventID, keyID, sealed)
	}
	br := tx.SendBatch(ctx, b)
	for range msgs {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return fmt.Errorf("outbox: enqueue into %s: %w", t.quoted, err)
		}
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("outbox: enqueue into %s: %w", t.quoted, err)
	}
	return nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// table is a parsed, quoted outbox table name.
type table struct {
	name   string // as configured
	quoted string
	rounds string // the quoted table of Relay.ExactlyOnce's rounds
}

func parseTable(name string) (table, error) {
	if name == "" {
		name = defaultTable
	}
	n, err := outboxstore.Parse(name)
	if err != nil {
		return table{}, err
	}
	return table{name: name, quoted: n.Quoted, rounds: outboxstore.Rounds(n)}, nil
}

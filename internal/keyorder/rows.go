package keyorder

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/idemhq/idem/internal/mask"
	"github.com/idemhq/idem/internal/seal"
)

// parkedRow is a Record as a row of idem_ordering_parked holds it (the key
// columns aside): the headers as two parallel bytea[] columns, so that names
// and values round-trip byte for byte.
type parkedRow struct {
	seq          int64
	ikey         string
	partition    int32
	offset       int64
	ts           time.Time
	value        []byte
	headerKeys   [][]byte // NOT NULL: never nil
	headerValues [][]byte // a nil element is a null header value
	keyID        *int64   // the data key of sealed; nil: stored in clear
	sealed       []byte   // value and headers, sealed (seal.Pack)
}

// parkedCols are the columns parkedRow.dest scans, in order.
const parkedCols = `seq, idempotency_key, "partition", "offset", record_time, value, header_keys, header_values, key_id, sealed`

func (w *parkedRow) dest() []any {
	return []any{&w.seq, &w.ikey, &w.partition, &w.offset, &w.ts, &w.value, &w.headerKeys, &w.headerValues, &w.keyID, &w.sealed}
}

// parkedAAD binds a parked row's sealed payload to the message it parks.
func (s *Store) parkedAAD(topic string, key []byte, ikey string, partition int32, offset int64) []byte {
	return seal.AAD("idem_ordering_parked", s.group, topic, string(key), ikey, fmt.Sprint(partition), fmt.Sprint(offset))
}

// pendingAAD binds a pending head's sealed payload to it.
func (s *Store) pendingAAD(r Record) []byte {
	return seal.AAD("idem_ordering_heads", s.group, r.Topic, string(r.Key), r.IdempotencyKey, fmt.Sprint(r.Partition), fmt.Sprint(r.Offset))
}

// sealRow seals w's payload in place under k: the value and header columns
// are left empty, the sealed column and key id set.
func (s *Store) sealRow(k *seal.Key, w *parkedRow, topic string, key []byte) {
	hs := make([]seal.Header, len(w.headerKeys))
	for i := range w.headerKeys {
		hs[i] = seal.Header{Key: w.headerKeys[i], Value: w.headerValues[i]}
	}
	w.sealed = k.Seal(seal.Pack(w.value, hs), s.parkedAAD(topic, key, w.ikey, w.partition, w.offset))
	id := k.ID()
	w.keyID = &id
	w.value, w.headerKeys, w.headerValues = nil, [][]byte{}, [][]byte{}
}

// open opens the sealed payload of a parked row into it (Value and
// Headers as stored in clear). An unreadable payload (seal.Unreadable)
// leaves them empty and is returned as unreadable; any other error (no
// key, a wrong KEK, the database) is returned as err.
func (s *Store) open(ctx context.Context, w *parkedRow, topic string, key []byte) (unreadable, err error) {
	if w.keyID == nil {
		return nil, nil
	}
	if s.sealer == nil {
		return nil, fmt.Errorf("keyorder: parked message %q of %s: %w", w.ikey, topic, seal.ErrNoKey)
	}
	value, hs, err := s.openPayload(ctx, *w.keyID, w.sealed, s.parkedAAD(topic, key, w.ikey, w.partition, w.offset))
	if err != nil {
		if seal.Unreadable(err) {
			return fmt.Errorf("parked message %q of %s offset %d: %w", w.ikey, topic, w.offset, err), nil
		}
		return nil, err
	}
	w.value, w.headerKeys, w.headerValues = value, make([][]byte, len(hs)), make([][]byte, len(hs))
	for i, h := range hs {
		w.headerKeys[i], w.headerValues[i] = h.Key, h.Value
	}
	return nil, nil
}

// openPayload opens and unpacks a sealed payload.
func (s *Store) openPayload(ctx context.Context, keyID int64, sealed, aad []byte) ([]byte, []seal.Header, error) {
	pt, err := s.sealer.Open(ctx, keyID, sealed, aad)
	if err != nil {
		return nil, nil, err
	}
	return seal.Unpack(pt)
}

// restore is the Record of the parked row w of topic and key, its payload
// opened.
func (s *Store) restore(ctx context.Context, w parkedRow, topic string, key []byte) (Record, error) {
	unreadable, err := s.open(ctx, &w, topic, key)
	if err != nil {
		return Record{}, err
	}
	r, err := w.record(topic, key)
	r.Unreadable = unreadable
	return r, err
}

// toParkedRow is the row that parks r.
func toParkedRow(r Record) parkedRow {
	w := parkedRow{
		seq: r.Seq, ikey: r.IdempotencyKey, partition: r.Partition, offset: r.Offset, ts: r.Timestamp, value: r.Value,
		headerKeys: make([][]byte, len(r.Headers)), headerValues: make([][]byte, len(r.Headers)),
	}
	for i, h := range r.Headers {
		w.headerKeys[i] = append([]byte{}, h.Key...)
		w.headerValues[i] = h.Value
	}
	return w
}

// record restores the Record parked as w under topic and key. A record
// without headers restores with nil Headers.
func (w parkedRow) record(topic string, key []byte) (Record, error) {
	r := Record{
		Seq: w.seq, Topic: topic, Key: key, IdempotencyKey: w.ikey,
		Partition: w.partition, Offset: w.offset, Timestamp: w.ts, Value: w.value,
	}
	if len(w.headerKeys) != len(w.headerValues) {
		return r, fmt.Errorf("keyorder: parked row %d: %d header names but %d values", w.seq, len(w.headerKeys), len(w.headerValues))
	}
	if len(w.headerKeys) > 0 {
		r.Headers = make([]Header, len(w.headerKeys))
		for i := range w.headerKeys {
			r.Headers[i] = Header{Key: string(w.headerKeys[i]), Value: w.headerValues[i]}
		}
	}
	return r, nil
}

// encodePending and decodePending are the heads.pending column's JSON form.
// Topic and IdempotencyKey are valid UTF-8 without NUL (Kafka and the
// consumer's key check see to it); NULs in Error, which jsonb cannot store,
// are dropped. With a sealer, the value and headers are sealed in q (the
// promotion's transaction) into Sealed, and card numbers are taken out of
// Error, which stays in clear.
func (s *Store) encodePending(ctx context.Context, q seal.DB, r Record) ([]byte, error) {
	r.Error = strings.ReplaceAll(r.Error, "\x00", "")
	if s.sealer != nil {
		hs := make([]seal.Header, len(r.Headers))
		for i, h := range r.Headers {
			hs[i] = seal.Header{Key: []byte(h.Key), Value: h.Value}
		}
		ct, id, err := s.sealer.Seal(ctx, q, seal.Pack(r.Value, hs), s.pendingAAD(r))
		if err != nil {
			return nil, err
		}
		r.Value, r.Headers, r.Sealed, r.KeyID = nil, nil, ct, id
		r.Error = mask.CardNumbers(r.Error)
	}
	return json.Marshal(r)
}

// decodePending reads a pending record, its payload opened (see open for
// the errors).
func (s *Store) decodePending(ctx context.Context, b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, err
	}
	if r.KeyID == 0 {
		return r, nil
	}
	if s.sealer == nil {
		return r, fmt.Errorf("keyorder: pending head %q of %s: %w", r.IdempotencyKey, r.Topic, seal.ErrNoKey)
	}
	value, hs, err := s.openPayload(ctx, r.KeyID, r.Sealed, s.pendingAAD(r))
	r.Sealed, r.KeyID = nil, 0
	if err != nil {
		if !seal.Unreadable(err) {
			return r, err
		}
		r.Unreadable = fmt.Errorf("pending head %q of %s offset %d: %w", r.IdempotencyKey, r.Topic, r.Offset, err)
		return r, nil
	}
	r.Value, r.Headers = value, nil
	for _, h := range hs {
		r.Headers = append(r.Headers, Header{Key: string(h.Key), Value: h.Value})
	}
	return r, nil
}

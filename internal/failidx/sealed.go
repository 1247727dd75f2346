package failidx

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/mask"
	"github.com/idemhq/idem/internal/seal"
)

// Purpose is the internal/seal purpose of the failure index's data keys.
const Purpose = "dlq-index"

// ErrNoEncryptionKey is a Record's PayloadErr when its payload is sealed
// and the Store was given no key-encryption key (Sealed).
var ErrNoEncryptionKey = errors.New("index: the payload is encrypted at rest and no encryption key was given")

// Unavailable names why a payload cannot be read, as the console and the
// CLI show it: "key destroyed", "tampered", "wrong encryption key",
// "encrypted, no key given", or "" for err nil.
func Unavailable(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, seal.ErrKeyDestroyed):
		return "key destroyed"
	case errors.Is(err, seal.ErrTampered):
		return "tampered"
	case errors.Is(err, seal.ErrWrongKEK):
		return "wrong encryption key"
	case errors.Is(err, ErrNoEncryptionKey):
		return "encrypted, no key given"
	}
	return "unreadable"
}

// errNotOpened is a sealed Record's PayloadErr until Store.open opens it.
var errNotOpened = errors.New("index: sealed payload not opened")

// sealedPayload is a sealed row's value and headers as stored.
type sealedPayload struct{ value, headers []byte }

// Sealed returns a Store that opens, and (for Actions' edits) seals,
// payloads with sl; nil leaves them as they are (rows written in clear
// read as ever; sealed ones come back with PayloadErr ErrNoEncryptionKey).
func (s *Store) Sealed(sl *seal.Sealer) *Store {
	c := *s
	c.sealer = sl
	return &c
}

// recordAAD binds a sealed field (value or headers) to its record's
// position in the DLQ, so that it cannot be moved to another row.
func RecordAAD(field, topic string, partition int32, offset int64) []byte {
	return []byte("idem_dlq_records\x00" + field + "\x00" + topic + "\x00" + strconv.Itoa(int(partition)) + "\x00" + strconv.FormatInt(offset, 10))
}

// versionAAD binds an edited version's sealed value to its record.
func versionAAD(recordID int64) []byte {
	return []byte("idem_dlq_versions\x00value\x00" + strconv.FormatInt(recordID, 10))
}

// open opens the sealed payloads of recs in place: Value and Headers, or
// PayloadErr when they cannot be read. A row read without its payload
// (listCols: value NULL, headers empty; sealed headers are never empty)
// has nothing to open and keeps them nil, without PayloadErr. It fails only
// when the keys cannot be read at all (the database).
func (s *Store) open(ctx context.Context, recs []Record) error {
	for i := range recs {
		r := &recs[i]
		if r.sealed == nil {
			continue
		}
		if r.sealed.value == nil && len(r.sealed.headers) == 0 {
			r.sealed, r.PayloadErr = nil, nil
			continue
		}
		if s.sealer == nil {
			r.PayloadErr = ErrNoEncryptionKey
			continue
		}
		r.Value, r.Headers, r.PayloadErr = nil, nil, nil
		var hs []byte
		err := s.openField(ctx, r.KeyID, &hs, r.sealed.headers, RecordAAD("headers", r.Topic, r.Partition, r.Offset))
		if err == nil && r.sealed.value != nil {
			err = s.openField(ctx, r.KeyID, &r.Value, r.sealed.value, RecordAAD("value", r.Topic, r.Partition, r.Offset))
		}
		if err == nil {
			r.Headers, err = decodeHeaders(hs)
		}
		if err != nil {
			if !payloadErr(err) {
				return err
			}
			r.Value, r.Headers, r.PayloadErr = nil, nil, fmt.Errorf("record %d: %w", r.ID, err)
		}
		r.sealed = nil
	}
	return nil
}

// openField opens one sealed field into *dst.
func (s *Store) openField(ctx context.Context, keyID int64, dst *[]byte, sealed, aad []byte) error {
	pt, err := s.sealer.Open(ctx, keyID, sealed, aad)
	*dst = pt
	return err
}

// payloadErr reports whether err is about one row's payload (shown as
// such) rather than the database.
func payloadErr(err error) bool {
	return errors.Is(err, seal.ErrKeyDestroyed) || errors.Is(err, seal.ErrWrongKEK) || errors.Is(err, seal.ErrTampered) || errors.Is(err, errBadHeaders)
}

// openVersions opens the sealed values of record id's versions in place.
func (s *Store) openVersions(ctx context.Context, id int64, vs []Version) error {
	for i := range vs {
		v := &vs[i]
		if v.KeyID == 0 {
			continue
		}
		sealed := v.Value
		v.Value = nil
		if s.sealer == nil {
			v.PayloadErr = ErrNoEncryptionKey
			continue
		}
		if err := s.openField(ctx, v.KeyID, &v.Value, sealed, versionAAD(id)); err != nil {
			if !payloadErr(err) {
				return err
			}
			v.Value, v.PayloadErr = nil, fmt.Errorf("version %d: %w", v.N, err)
		}
	}
	return nil
}

// sealVersion seals an edited value for idem_dlq_versions in tx: the value
// to store and its key id (the value itself and nil when the store seals
// nothing).
func (s *Store) sealVersion(ctx context.Context, tx pgx.Tx, recordID int64, value []byte) ([]byte, *int64, error) {
	if s.sealer == nil {
		return value, nil, nil
	}
	ct, id, err := s.sealer.Seal(ctx, tx, value, versionAAD(recordID))
	if err != nil {
		return nil, nil, fmt.Errorf("index: seal the edited value: %w", err)
	}
	return ct, &id, nil
}

// Values returns the values of the records ids that the index holds and
// can read (opened when sealed), for masking: the console looks in each
// record's error text for the values it masks in its payload. Records
// without a value, or whose payload cannot be read, are left out.
func (s *Store) Values(ctx context.Context, ids []int64) (map[int64][]byte, error) {
	out := map[int64][]byte{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `SELECT id, dlq_topic, dlq_partition, dlq_offset, value, coalesce(key_id, 0)
		FROM idem_dlq_records WHERE id = ANY($1) AND value IS NOT NULL`, ids)
	if err != nil {
		return nil, fmt.Errorf("index: values: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
		var r Record
		err := row.Scan(&r.ID, &r.Topic, &r.Partition, &r.Offset, &r.Value, &r.KeyID)
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("index: values: %w", err)
	}
	for _, r := range recs {
		v := r.Value
		if r.KeyID != 0 {
			if s.sealer == nil {
				continue
			}
			if v, err = s.sealer.Open(ctx, r.KeyID, r.Value, RecordAAD("value", r.Topic, r.Partition, r.Offset)); err != nil {
				if payloadErr(err) {
					continue
				}
				return nil, fmt.Errorf("index: values: %w", err)
			}
		}
		out[r.ID] = v
	}
	return out, nil
}

// seal seals the batch's values and headers in place under the current
// data key, in the batch's transaction, and returns the key id (nil when
// there is no sealer). With encryption on, the columns kept in clear for
// search and grouping hold no card number: the error and stack text lose
// them (the full text is in the sealed headers idem-error and idem-stack).
func (c *columns) seal(ctx context.Context, tx pgx.Tx, sl *seal.Sealer) (*int64, error) {
	if sl == nil {
		return nil, nil
	}
	k, err := sl.Current(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("index: data key: %w", err)
	}
	for i := range c.topic {
		if c.value[i] != nil {
			c.value[i] = k.Seal(c.value[i], RecordAAD("value", c.topic[i], c.partition[i], c.offset[i]))
		}
		c.headers[i] = k.Seal(c.headers[i], RecordAAD("headers", c.topic[i], c.partition[i], c.offset[i]))
		c.errText[i] = mask.CardNumbers(c.errText[i])
		c.stack[i] = mask.CardNumbers(c.stack[i])
	}
	id := k.ID()
	return &id, nil
}

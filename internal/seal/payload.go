package seal

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/internal/pgmigrate"
)

// Payload sealing for the owners of message tables (parked ordering rows,
// deferred messages, outbox rows): a record's value and headers are packed
// into one blob (Pack), sealed as a unit under one data key with additional
// data naming the row, and stored in the row's sealed column beside its
// key id, its clear value and header columns left empty. What a record
// needs to be routed (topic, partition, Kafka key, idempotency key, origin)
// stays in clear: a row whose key was destroyed can still be reported and
// dead-lettered as a stub.

// Header is one record header as Pack packs it: the name's bytes and the
// value, nil for a null value.
type Header struct {
	Key, Value []byte
}

// Pack packs a record's value (nil stays nil) and headers into one blob
// for Seal: a byte saying whether there is a value, the value's uvarint
// length and bytes, then the headers in AppendHeaders' form. Unpack
// reverses it byte for byte.
func Pack(value []byte, headers []Header) []byte {
	out := make([]byte, 0, 1+binary.MaxVarintLen64+len(value)+32*len(headers))
	if value == nil {
		out = append(out, 0)
	} else {
		out = append(out, 1)
		out = binary.AppendUvarint(out, uint64(len(value)))
		out = append(out, value...)
	}
	return AppendHeaders(out, headers)
}

// AppendHeaders appends headers to dst: for each, its name's uvarint
// length and bytes, and its value's uvarint length plus one (0: a null
// value) and bytes. ReadHeaders reverses it; the failure index keeps its
// headers column in this form too.
func AppendHeaders(dst []byte, headers []Header) []byte {
	for _, h := range headers {
		dst = binary.AppendUvarint(dst, uint64(len(h.Key)))
		dst = append(dst, h.Key...)
		if h.Value == nil {
			dst = binary.AppendUvarint(dst, 0)
			continue
		}
		dst = binary.AppendUvarint(dst, uint64(len(h.Value))+1)
		dst = append(dst, h.Value...)
	}
	return dst
}

// errBadPayload is Unpack's error for bytes Pack did not write.
var errBadPayload = errors.New("seal: sealed payload does not unpack")

// Unpack is Pack's inverse. An empty value stays empty; headers are
// empty (not nil) when there were none.
func Unpack(b []byte) (value []byte, headers []Header, err error) {
	if len(b) == 0 || b[0] > 1 {
		return nil, nil, errBadPayload
	}
	has := b[0] == 1
	b = b[1:]
	if has {
		if value, b, err = field(b, false); err != nil {
			return nil, nil, err
		}
	}
	headers, err = ReadHeaders(b)
	if err != nil {
		return nil, nil, err
	}
	return value, headers, nil
}

// ReadHeaders reads headers in AppendHeaders' form: an empty (not nil)
// slice for none; an error wrapping a bad payload (Unreadable) for bytes
// AppendHeaders did not write.
func ReadHeaders(b []byte) ([]Header, error) {
	out := []Header{}
	for len(b) > 0 {
		var h Header
		var err error
		if h.Key, b, err = field(b, false); err != nil {
			return nil, err
		}
		if h.Value, b, err = field(b, true); err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, nil
}

// field reads one length-prefixed field off b (plusOne: the length is
// written plus one, 0 meaning nil) and returns it, copied, with the rest.
func field(b []byte, plusOne bool) ([]byte, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, nil, errBadPayload
	}
	b = b[k:]
	if plusOne {
		if n == 0 {
			return nil, b, nil
		}
		n--
	}
	if n > uint64(len(b)) {
		return nil, nil, errBadPayload
	}
	v := make([]byte, n)
	copy(v, b)
	return v, b[n:], nil
}

// Unreadable reports whether err (from Open or Unpack) says a row's payload
// is gone for good or cannot be trusted: its data key was destroyed, or the
// sealed bytes do not authenticate. Its owner then ends the row in its
// defined outcome (never publishing it) instead of trying again. A wrong
// KEK (ErrWrongKEK) is not: another process, or this one restarted with the
// right key file, can still read the row.
func Unreadable(err error) bool {
	return errors.Is(err, ErrKeyDestroyed) || errors.Is(err, ErrTampered) || errors.Is(err, errBadPayload)
}

// ErrNoKey is the error of a sealed row read by a process that was given no
// key-encryption key: the row waits for a process that has one.
var ErrNoKey = errors.New("seal: the payload is encrypted at rest and no encryption key was given")

// Load returns the Sealer of purpose for the key-encryption keys of file or
// text (LoadKEKs: a key file, or a key given directly, e.g. from the
// environment), after creating idem_seal_keys if need be (Migrate); nil,
// nil when both are empty (encryption off). Its errors wrap LoadKEKs' and
// New's: a file others may read, a KEK that does not unwrap purpose's keys
// (ErrWrongKEK).
func Load(ctx context.Context, db interface {
	DB
	pgmigrate.DB
}, file, text, purpose string) (*Sealer, error) {
	keks, err := LoadKEKs(file, text)
	if err != nil || keks == nil {
		return nil, err
	}
	if err := Migrate(ctx, db); err != nil {
		return nil, err
	}
	s, err := New(ctx, Config{DB: db, KEKs: keks, Purpose: purpose})
	if err != nil {
		return nil, fmt.Errorf("seal: %s: %w", purpose, err)
	}
	return s, nil
}

// AAD returns the additional data that binds a sealed payload to its row:
// the parts (table, then the row's identifying columns), each preceded by
// its uvarint length, so that no two lists of parts give the same bytes.
func AAD(parts ...string) []byte {
	n := 0
	for _, p := range parts {
		n += binary.MaxVarintLen64 + len(p)
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = binary.AppendUvarint(out, uint64(len(p)))
		out = append(out, p...)
	}
	return out
}

// ForWriting returns a Sealer of cfg that only seals (Seal, Current, in the
// writer's transaction), without New's read and check of every data key of
// the purpose: for a writer that makes one per call (outbox.Relay.Enqueue),
// for which New would cost more than the sealing. cfg.DB is not needed;
// Open, given none, fails. A KEK that cannot unwrap the purpose's current
// key fails at the first Seal (ErrWrongKEK).
func ForWriting(cfg Config) (*Sealer, error) {
	switch {
	case len(cfg.KEKs) == 0:
		return nil, errors.New("seal: Config.KEKs is empty: give at least one key-encryption key")
	case cfg.Purpose == "":
		return nil, errors.New("seal: Config.Purpose is empty")
	}
	if cfg.MaxKeyAge <= 0 {
		cfg.MaxKeyAge = defaultMaxKeyAge
	}
	if cfg.CacheTTL <= 0 {
		cfg.CacheTTL = defaultCacheTTL
	}
	return &Sealer{cfg: cfg, now: time.Now, keys: map[int64]*dataKey{}}, nil
}

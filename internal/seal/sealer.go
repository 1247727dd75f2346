package seal

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Defaults of Config.
const (
	// defaultMaxKeyAge is how long a data key seals new rows before the next
	// writer starts a new one. With one key a month, destroying a key shreds
	// about a month of rows; and a key seals far fewer than the 2^32 values
	// random 96-bit nonces allow.
	defaultMaxKeyAge = 30 * 24 * time.Hour
	// defaultCacheTTL is how long Open trusts a data key it has read before
	// it reads the key's row again: a key destroyed or re-wrapped elsewhere
	// is seen within this time.
	defaultCacheTTL = time.Second
)

// Config configures a Sealer.
type Config struct {
	// DB holds idem_seal_keys (Migrate). Open reads keys through it.
	// Required.
	DB DB
	// KEKs are the key-encryption keys (LoadKEKs): the first wraps new data
	// keys, all of them unwrap. Required.
	KEKs []KEK
	// Purpose names what the keys seal, e.g. "dlq-index": each purpose has
	// keys of its own, so shredding one never touches another. Required.
	Purpose string
	// MaxKeyAge is how long a data key seals new rows; the first writer
	// after that starts a new key.
	// Default: 30 days.
	MaxKeyAge time.Duration
	// CacheTTL is how long Open uses a data key before it reads its row
	// again (to see it destroyed or re-wrapped).
	// Default: 1 s.
	CacheTTL time.Duration
}

// Sealer seals and opens payloads of one purpose. It is safe for
// concurrent use.
type Sealer struct {
	cfg  Config
	now  func() time.Time
	mu   sync.Mutex
	keys map[int64]*dataKey
}

// dataKey is an unwrapped data key.
type dataKey struct {
	id      int64
	aead    cipher.AEAD
	wrapped []byte    // as read: a change means re-wrapped, read again
	created time.Time // when the key was made
	checked time.Time // when Open last read its row
}

// New returns a Sealer after checking that cfg.KEKs unwrap every live data
// key of cfg.Purpose: a wrong key file is refused at start (an error
// wrapping ErrWrongKEK that names the KEK ids), not at the first row.
func New(ctx context.Context, cfg Config) (*Sealer, error) {
	switch {
	case cfg.DB == nil:
		return nil, errors.New("seal: Config.DB is nil")
	case len(cfg.KEKs) == 0:
		return nil, errors.New("seal: Config.KEKs is empty: give at least one key-encryption key")
	case cfg.Purpose == "":
		return nil, errors.New("seal: Config.Purpose is empty")
	case cfg.MaxKeyAge < 0:
		return nil, fmt.Errorf("seal: Config.MaxKeyAge %v is negative", cfg.MaxKeyAge)
	case cfg.CacheTTL < 0:
		return nil, fmt.Errorf("seal: Config.CacheTTL %v is negative", cfg.CacheTTL)
	}
	if cfg.MaxKeyAge == 0 {
		cfg.MaxKeyAge = defaultMaxKeyAge
	}
	if cfg.CacheTTL == 0 {
		cfg.CacheTTL = defaultCacheTTL
	}
	s := &Sealer{cfg: cfg, now: time.Now, keys: map[int64]*dataKey{}}
	rows, err := cfg.DB.Query(ctx, `SELECT key_id, kek_id, wrapped_key, created_at FROM idem_seal_keys
		WHERE purpose = $1 AND wrapped_key IS NOT NULL ORDER BY key_id`, cfg.Purpose)
	if err != nil {
		return nil, fmt.Errorf("seal: read data keys (run idem migrate?): %w", err)
	}
	type row struct {
		id      int64
		kek     string
		wrapped []byte
		created time.Time
	}
	live, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.kek, &x.wrapped, &x.created)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("seal: read data keys: %w", err)
	}
	var bad []error
	for _, r := range live {
		if _, err := s.remember(r.id, r.kek, r.wrapped, r.created); err != nil {
			bad = append(bad, err)
		}
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("seal: %s: %d of %d data keys cannot be unwrapped: %w", cfg.Purpose, len(bad), len(live), errors.Join(bad...))
	}
	return s, nil
}

// remember unwraps a key and caches it.
func (s *Sealer) remember(id int64, kekID string, wrapped []byte, created time.Time) (*dataKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.keys[id]; k != nil && slices.Equal(k.wrapped, wrapped) {
		k.checked = s.now()
		return k, nil
	}
	raw, err := unwrap(s.cfg.KEKs, id, s.cfg.Purpose, kekID, wrapped)
	if err != nil {
		return nil, err
	}
	aead, err := newAEAD(raw)
	clear(raw)
	if err != nil {
		return nil, err
	}
	k := &dataKey{id: id, aead: aead, wrapped: wrapped, created: created, checked: s.now()}
	s.keys[id] = k
	return k, nil
}

// Key is a data key ready to seal: Current's answer, for a batch of rows.
type Key struct {
	k *dataKey
}

// ID is the data key's id, to store beside each row it seals.
func (k *Key) ID() int64 { return k.k.id }

// Seal encrypts plaintext under the key, bound to aad (what identifies the
// row and field, e.g. "idem_dlq_records/value/topic/0/42"): the same aad
// must be given to Open. The result is Overhead bytes longer.
func (k *Key) Seal(plaintext, aad []byte) []byte { return sealWith(k.k.aead, plaintext, aad) }

// Current returns the data key to seal with now, inside the writer's
// transaction q: the newest live key of the purpose, locked FOR SHARE so
// that it cannot be destroyed before q commits, or a new key when there is
// none or it is older than MaxKeyAge. The new key's row is written in q:
// if q rolls back, so does the key. So no row is ever sealed under a key
// destroyed before it was written.
//
// When the newest key is wrapped by a KEK this Sealer does not hold (the
// KEK was rotated since it started), the error wraps ErrWrongKEK: restart
// with the new key file. Current never makes a new key then, which a reader
// holding only the new KEK could not unwrap.
func (s *Sealer) Current(ctx context.Context, q DB) (*Key, error) {
	var id int64
	var kekID string
	var wrapped []byte
	var created time.Time
	err := q.QueryRow(ctx, `SELECT key_id, kek_id, wrapped_key, created_at FROM idem_seal_keys
		WHERE purpose = $1 AND wrapped_key IS NOT NULL ORDER BY created_at DESC, key_id DESC LIMIT 1 FOR SHARE`,
		s.cfg.Purpose).Scan(&id, &kekID, &wrapped, &created)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, fmt.Errorf("seal: current data key: %w", err)
	case s.now().Sub(created) < s.cfg.MaxKeyAge:
		k, err := s.remember(id, kekID, wrapped, created)
		if err != nil {
			return nil, err
		}
		return &Key{k}, nil
	default:
		// Too old: a new key, unless the old one says the KEK changed.
		if !slices.ContainsFunc(s.cfg.KEKs, func(k KEK) bool { return k.id == kekID }) {
			_, err := s.remember(id, kekID, wrapped, created)
			return nil, err
		}
	}
	k, err := newKey(ctx, q, s.cfg.KEKs[0], s.cfg.Purpose)
	if err != nil {
		return nil, err
	}
	dk, err := s.remember(k.id, k.kekID, k.wrapped, k.created)
	if err != nil {
		return nil, err
	}
	return &Key{dk}, nil
}

// newKeyRow is a data key row newKey wrote.
type newKeyRow struct {
	id      int64
	kekID   string
	wrapped []byte
	created time.Time
}

// newKey makes a data key for purpose wrapped by kek, in q.
func newKey(ctx context.Context, q DB, kek KEK, purpose string) (newKeyRow, error) {
	var r newKeyRow
	if err := q.QueryRow(ctx, `SELECT nextval(pg_get_serial_sequence('idem_seal_keys', 'key_id'))`).Scan(&r.id); err != nil {
		return r, fmt.Errorf("seal: new data key: %w", err)
	}
	raw := make([]byte, KeySize)
	if _, err := rand.Read(raw); err != nil {
		return r, fmt.Errorf("seal: new data key: %w", err)
	}
	r.wrapped = sealWith(kek.aead, raw, wrapAAD(r.id, purpose))
	clear(raw)
	r.kekID = kek.id
	if err := q.QueryRow(ctx, `INSERT INTO idem_seal_keys (key_id, purpose, kek_id, wrapped_key) VALUES ($1, $2, $3, $4) RETURNING created_at`,
		r.id, purpose, r.kekID, r.wrapped).Scan(&r.created); err != nil {
		return r, fmt.Errorf("seal: new data key: %w", err)
	}
	return r, nil
}

// Seal seals one payload under the current key, in the writer's
// transaction q (see Current), and returns it with the key's id: the one
// call an owner of a table needs on its write path.
//
//	ct, keyID, err := sealer.Seal(ctx, tx, value, aad)
func (s *Sealer) Seal(ctx context.Context, q DB, plaintext, aad []byte) ([]byte, int64, error) {
	k, err := s.Current(ctx, q)
	if err != nil {
		return nil, 0, err
	}
	return k.Seal(plaintext, aad), k.ID(), nil
}

// Open decrypts what Seal sealed under data key keyID with the same aad.
// Errors wrap ErrKeyDestroyed (the key was destroyed: what it sealed is
// gone), ErrWrongKEK (no KEK given unwraps it) or ErrTampered (sealed or aad
// do not match), and name the key id.
func (s *Sealer) Open(ctx context.Context, keyID int64, sealed, aad []byte) ([]byte, error) {
	k, err := s.key(ctx, keyID)
	if err != nil {
		return nil, err
	}
	pt, err := openWith(k.aead, sealed, aad)
	if err != nil {
		return nil, fmt.Errorf("data key %d: %w", keyID, err)
	}
	return pt, nil
}

// key returns data key id: from the cache when it was read less than
// CacheTTL ago, else from its row.
func (s *Sealer) key(ctx context.Context, id int64) (*dataKey, error) {
	s.mu.Lock()
	k := s.keys[id]
	fresh := k != nil && s.now().Sub(k.checked) < s.cfg.CacheTTL
	s.mu.Unlock()
	if fresh {
		return k, nil
	}
	if s.cfg.DB == nil {
		return nil, fmt.Errorf("seal: data key %d: this sealer only writes (ForWriting)", id)
	}
	var purpose string
	var kekID *string
	var wrapped []byte
	var created time.Time
	var destroyed *time.Time
	var by, reason string
	err := s.cfg.DB.QueryRow(ctx, `SELECT purpose, kek_id, wrapped_key, created_at, destroyed_at, destroyed_by, destroyed_reason
		FROM idem_seal_keys WHERE key_id = $1`, id).Scan(&purpose, &kekID, &wrapped, &created, &destroyed, &by, &reason)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		s.forget(id)
		return nil, fmt.Errorf("data key %d: %w (no such key: its row was deleted)", id, ErrKeyDestroyed)
	case err != nil:
		return nil, fmt.Errorf("seal: read data key %d: %w", id, err)
	case destroyed != nil:
		s.forget(id)
		return nil, fmt.Errorf("data key %d: %w at %s by %s (%s)", id, ErrKeyDestroyed, destroyed.UTC().Format(time.RFC3339), by, reason)
	case purpose != s.cfg.Purpose:
		return nil, fmt.Errorf("data key %d: %w: it seals %q, not %q", id, ErrTampered, purpose, s.cfg.Purpose)
	}
	return s.remember(id, *kekID, wrapped, created)
}

func (s *Sealer) forget(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, id)
}

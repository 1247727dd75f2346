package seal

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates or upgrades idem_seal_keys; pgmigrate component "seal".
// It is idempotent and safe when several processes start at once.
func Migrate(ctx context.Context, db pgmigrate.DB) error {
	if err := pgmigrate.LoadApply(ctx, db, "seal", migrationFS, nil); err != nil {
		return fmt.Errorf("seal: migrate: %w", err)
	}
	return nil
}

// KeyInfo describes one data key, never its bytes.
type KeyInfo struct {
	ID      int64  `json:"id"`
	Purpose string `json:"purpose"`
	// KEKID is the KEK that wraps it ("" once destroyed).
	KEKID       string    `json:"kek_id"`
	CreatedAt   time.Time `json:"created_at"`
	RewrappedAt time.Time `json:"rewrapped_at,omitzero"` // zero: never re-wrapped
	// DestroyedAt, DestroyedBy and DestroyedReason say who destroyed it,
	// when and why (zero: live).
	DestroyedAt     time.Time `json:"destroyed_at,omitzero"`
	DestroyedBy     string    `json:"destroyed_by,omitempty"`
	DestroyedReason string    `json:"destroyed_reason,omitempty"`
}

// Keys returns every data key, oldest first.
func Keys(ctx context.Context, db DB) ([]KeyInfo, error) {
	rows, err := db.Query(ctx, `SELECT key_id, purpose, coalesce(kek_id, ''), created_at, rewrapped_at, destroyed_at, destroyed_by, destroyed_reason
		FROM idem_seal_keys ORDER BY key_id`)
	if err != nil {
		return nil, fmt.Errorf("seal: list keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (KeyInfo, error) {
		var k KeyInfo
		var rewrapped, destroyed *time.Time
		err := r.Scan(&k.ID, &k.Purpose, &k.KEKID, &k.CreatedAt, &rewrapped, &destroyed, &k.DestroyedBy, &k.DestroyedReason)
		if rewrapped != nil {
			k.RewrappedAt = *rewrapped
		}
		if destroyed != nil {
			k.DestroyedAt = *destroyed
		}
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("seal: list keys: %w", err)
	}
	return out, nil
}

// RotateResult counts what Rotate did.
type RotateResult struct {
	// Rewrapped keys now wrapped by the new KEK; Already those it wrapped
	// before (Rotate run again).
	Rewrapped, Already int
}

// Rotate re-wraps every live data key under to, in one transaction: each
// key is unwrapped with whichever of from (or to) wraps it. The sealed rows
// are not read or changed. When a key is wrapped by none of them, nothing
// is changed and the error (wrapping ErrWrongKEK) names the keys and their
// KEK ids. Running it again is harmless. Processes that hold only an old
// KEK must be restarted with the new one (or with both, new first).
func Rotate(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, from []KEK, to KEK) (RotateResult, error) {
	var res RotateResult
	keks := append([]KEK{to}, from...)
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT key_id, purpose, kek_id, wrapped_key FROM idem_seal_keys
			WHERE wrapped_key IS NOT NULL ORDER BY key_id FOR UPDATE`)
		if err != nil {
			return err
		}
		type row struct {
			id             int64
			purpose, kekID string
			wrapped        []byte
		}
		live, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
			var x row
			err := r.Scan(&x.id, &x.purpose, &x.kekID, &x.wrapped)
			return x, err
		})
		if err != nil {
			return err
		}
		var bad []error
		for _, k := range live {
			if k.kekID == to.id {
				res.Already++
				continue
			}
			raw, err := unwrap(keks, k.id, k.purpose, k.kekID, k.wrapped)
			if err != nil {
				bad = append(bad, err)
				continue
			}
			wrapped := sealWith(to.aead, raw, wrapAAD(k.id, k.purpose))
			clear(raw)
			if _, err := tx.Exec(ctx, `UPDATE idem_seal_keys SET kek_id = $2, wrapped_key = $3, rewrapped_at = now() WHERE key_id = $1`,
				k.id, to.id, wrapped); err != nil {
				return err
			}
			res.Rewrapped++
		}
		if len(bad) > 0 {
			return fmt.Errorf("%d data keys cannot be unwrapped with the keys given, nothing was re-wrapped: %w", len(bad), errors.Join(bad...))
		}
		return nil
	})
	if err != nil {
		return RotateResult{}, fmt.Errorf("seal: rotate to KEK id %s: %w", to.id, err)
	}
	return res, nil
}

// ErrNoSuchKey is wrapped by Destroy's error for a key id that is not in
// idem_seal_keys or is destroyed already.
var ErrNoSuchKey = errors.New("seal: no such live data key")

// Destroy forgets data key id: its wrapped bytes are cleared and who, when
// and why are kept. Every row sealed under it is unreadable from then on
// (Open: ErrKeyDestroyed); a writer never seals under it again (Current
// waits for writers holding it, then starts a new key). actor and reason
// are required.
func Destroy(ctx context.Context, db DB, id int64, actor, reason string) error {
	switch {
	case strings.TrimSpace(actor) == "":
		return errors.New("seal: destroy: actor is empty: say who destroys the key")
	case strings.TrimSpace(reason) == "":
		return errors.New("seal: destroy: reason is empty: say why the key is destroyed")
	}
	tag, err := db.Exec(ctx, `UPDATE idem_seal_keys SET wrapped_key = NULL, kek_id = NULL, destroyed_at = now(),
		destroyed_by = $2, destroyed_reason = $3 WHERE key_id = $1 AND wrapped_key IS NOT NULL`, id, actor, reason)
	if err != nil {
		return fmt.Errorf("seal: destroy data key %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: data key %d", ErrNoSuchKey, id)
	}
	return nil
}

// Roll starts a new data key for purpose now, wrapped by kek: writers seal
// under it from their next transaction (it is the newest). Roll before
// destroying the key writers use, so that nothing new is sealed under a key
// about to go.
func Roll(ctx context.Context, db DB, kek KEK, purpose string) (int64, error) {
	if purpose == "" {
		return 0, errors.New("seal: roll: purpose is empty")
	}
	r, err := newKey(ctx, db, kek, purpose)
	return r.id, err
}

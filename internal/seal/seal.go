// Package seal is the encryption at rest of payloads in idem's PostgreSQL tables
// (envelope encryption, standard library crypto only).
//
// A row's payload is sealed with AES-256-GCM under a data key: 32 random
// bytes, one per purpose (the failure index, parked ordering rows, deferred
// rows, the outbox) and period. Data keys live in idem_seal_keys, each
// wrapped (AES-256-GCM) by a key-encryption key (KEK) that is never stored:
// it comes from a file or the environment (LoadKEKs). A sealed row carries
// the id of its data key. An owner of a table needs two calls: New once
// (with the KEKs of LoadKEKs and its purpose), then Sealer.Seal(ctx, tx,
// value, aad) in the transaction that writes the row, which returns the
// sealed bytes and the key id to store beside them, and Sealer.Open(ctx,
// keyID, sealed, aad) to read it back (errors ErrKeyDestroyed,
// ErrWrongKEK, ErrTampered).
//
// Rotate re-wraps every data key under a new KEK; Destroy forgets a data
// key, which makes every row sealed under it unreadable for good
// (crypto-shredding). Neither reads or rewrites a sealed row.
//
// What an auditor asks:
//
//   - the KEK is only in the process's memory, read from a file that
//     LoadKEKFile refuses when others may read it, or from the environment;
//   - no key material is ever logged or put in an error: only key ids and
//     KEK ids (an HMAC of the KEK);
//   - a ciphertext is bound to its row by the caller's additional data, so a
//     sealed value moved to another row, or changed, fails to open
//     (ErrTampered);
//   - a destroyed key's wrapped bytes are cleared, but older copies survive
//     in PostgreSQL's WAL and backups, wrapped by the KEK of the time: rotate
//     to a new KEK and retire the old one to make those copies useless too.
package seal

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what the package needs from a database handle: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Errors of Open (wrapped, with the key id).
var (
	// ErrKeyDestroyed: the data key was destroyed (Destroy), or its row
	// deleted; what it sealed cannot be read any more.
	ErrKeyDestroyed = errors.New("seal: key destroyed")
	// ErrWrongKEK: none of the KEKs given wraps the data key (the error names
	// the KEK id that does), or the wrapped key does not unwrap.
	ErrWrongKEK = errors.New("seal: wrong key-encryption key")
	// ErrTampered: the sealed bytes do not authenticate under their key and
	// additional data: changed, cut, or moved from another row.
	ErrTampered = errors.New("seal: sealed data does not authenticate (tampered or corrupted)")
)

// formatVersion is the first byte of every sealed value and wrapped key.
const formatVersion = 1

// nonceSize is GCM's standard nonce size.
const nonceSize = 12

// Overhead is how many bytes sealing adds to a payload: a format byte, the
// nonce and GCM's tag.
const Overhead = 1 + nonceSize + 16

// sealWith encrypts plaintext with aead: version, random nonce, ciphertext
// and tag.
func sealWith(aead interface {
	Seal(dst, nonce, plaintext, additionalData []byte) []byte
}, plaintext, aad []byte) []byte {
	out := make([]byte, 1+nonceSize, Overhead+len(plaintext))
	out[0] = formatVersion
	if _, err := rand.Read(out[1:]); err != nil {
		panic("seal: crypto/rand failed: " + err.Error()) // crypto/rand never fails on supported systems
	}
	return aead.Seal(out, out[1:1+nonceSize], plaintext, aad)
}

// openWith is sealWith's inverse; any failure is ErrTampered.
func openWith(aead interface {
	Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error)
}, sealed, aad []byte) ([]byte, error) {
	if len(sealed) < Overhead || sealed[0] != formatVersion {
		return nil, ErrTampered
	}
	pt, err := aead.Open(nil, sealed[1:1+nonceSize], sealed[1+nonceSize:], aad)
	if err != nil {
		return nil, ErrTampered
	}
	if pt == nil {
		pt = []byte{}
	}
	return pt, nil
}

// wrapAAD binds a wrapped data key to its id and purpose.
func wrapAAD(id int64, purpose string) []byte {
	return []byte("idem-seal data key\x00" + purpose + "\x00" + strconv.FormatInt(id, 10))
}

// unwrap returns the data key id of purpose wrapped by one of keks.
func unwrap(keks []KEK, id int64, purpose, kekID string, wrapped []byte) ([]byte, error) {
	for _, k := range keks {
		if k.id != kekID {
			continue
		}
		key, err := openWith(k.aead, wrapped, wrapAAD(id, purpose))
		if err != nil {
			return nil, fmt.Errorf("%w: data key %d does not unwrap under KEK id %s (its wrapped bytes were changed)", ErrWrongKEK, id, kekID)
		}
		return key, nil
	}
	return nil, fmt.Errorf("%w: data key %d is wrapped by KEK id %s; the key given is %s: give the key file it was wrapped with, or the old and new keys during a rotation",
		ErrWrongKEK, id, kekID, kekIDs(keks))
}

func kekIDs(keks []KEK) string {
	s := ""
	for i, k := range keks {
		if i > 0 {
			s += ", "
		}
		s += "KEK id " + k.id
	}
	if s == "" {
		return "none"
	}
	return s
}

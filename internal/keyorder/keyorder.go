// Package keyorder is per-key order kept while a message sits in a retry
// tier (consumer.ByKey). It is internal: the consumer wires it.
//
// A key K is blocked while a row in idem_ordering_heads names its head: the
// message of K (by idempotency key) that went to a retry tier. Later messages of
// K are parked: stored, payload and all, in idem_ordering_parked, whose
// bigserial seq is their arrival order. When the head succeeds or is
// dead-lettered, the worker that resolved it drains the parked messages in seq
// order; a parked message that fails retriably becomes the new head. Every step
// is one PostgreSQL transaction holding the head row's lock, so parking and
// draining never interleave wrongly, and everything survives restarts and
// rebalances.
//
// A parked message promoted to head must be forwarded to a retry tier. Its
// record is written to heads.pending in the same transaction as the promotion
// and cleared after the forward is acked; Pending lists what a crash left
// unforwarded, and forwarding it again is safe (the inbox absorbs duplicates).
//
// With Kafka transactions (consumer.Config.Transactions) a drain's forwards
// commit later than its PostgreSQL steps, and may abort. The steps that hang
// on a forward (a parked message dead-lettered, a promotion to head) are
// then not applied at once but marked (Mark) with the source offset whose
// commit carries the forwards; Resolve applies them once that offset is
// committed, or reverts them when it is not. See Mark. The same marks carry
// the hooks such a transaction owes (OwedHook, table idem_txn_hooks): an
// OnDeadLettered call that may run only once its dead-letter record has
// committed. Each marked step checks that its claim still owns the
// partition (Claim, table idem_ordering_claims), so a member that lost it
// writes no mark its successor could take for its own.
package keyorder

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/seal"
)

// Purpose is the internal/seal purpose of the data keys that seal parked
// messages (consumer.Config.EncryptionKeyFile).
const Purpose = "ordering"

//go:embed migrations/*.sql
var migrationFS embed.FS

// DB is what the store needs; *pgxpool.Pool satisfies it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is the per-key ordering state of one consumer group.
type Store struct {
	db     DB
	group  string
	sealer *seal.Sealer // seals parked payloads (Sealed); nil: stored in clear
}

// Sealed returns a store that seals the payloads it parks (and the pending
// records it promotes) with sl, and opens sealed ones; nil stores them in
// clear. A store without a sealer reading a sealed row fails with an error
// wrapping seal.ErrNoKey (the row waits for a member with the key); a row
// whose key was destroyed, or that does not authenticate, comes back with
// its payload empty and Record.Unreadable set.
func (s *Store) Sealed(sl *seal.Sealer) *Store {
	c := *s
	c.sealer = sl
	return &c
}

// Header is one record header. Key holds the header name's bytes exactly as
// Kafka carried them (a Go string may hold any bytes, valid UTF-8 or not);
// Value is nil for a null header value and empty for an empty one.
type Header struct {
	Key   string
	Value []byte
}

// headerJSON is Header's JSON form in heads.pending: the name as text in "k"
// when it is valid UTF-8 without NUL, else base64 in "kb" (JSON text cannot
// hold other bytes, and PostgreSQL's jsonb refuses \u0000), and the value
// base64 in "v" (null for a null value).
type headerJSON struct {
	K  *string `json:"k,omitempty"`
	KB []byte  `json:"kb,omitempty"`
	V  []byte  `json:"v"`
}

// MarshalJSON encodes h so that UnmarshalJSON restores it byte for byte.
func (h Header) MarshalJSON() ([]byte, error) {
	j := headerJSON{V: h.Value}
	if utf8.ValidString(h.Key) && !strings.Contains(h.Key, "\x00") {
		j.K = &h.Key
	} else {
		j.KB = []byte(h.Key)
	}
	return json.Marshal(j)
}

// UnmarshalJSON decodes what MarshalJSON wrote (and the text-only form of
// earlier versions, {"k": name, "v": value}).
func (h *Header) UnmarshalJSON(b []byte) error {
	var j headerJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	switch {
	case j.K != nil:
		h.Key = *j.K
	default:
		h.Key = string(j.KB)
	}
	h.Value = j.V
	return nil
}

// Record is a parked (or pending) message.
type Record struct {
	Seq            int64     `json:"seq,omitempty"`
	Topic          string    `json:"topic"` // the original topic
	Key            []byte    `json:"key"`   // the Kafka key: what is ordered
	IdempotencyKey string    `json:"ikey"`
	Partition      int32     `json:"partition"`
	Offset         int64     `json:"offset"`
	Timestamp      time.Time `json:"ts"`
	Value          []byte    `json:"value"`
	Headers        []Header  `json:"headers"`
	// Attempt, Tier, Error describe the failure of a pending head.
	Attempt int    `json:"attempt,omitempty"`
	Tier    int    `json:"tier,omitempty"`
	Error   string `json:"error,omitempty"`
	// Dest and DLQ are where a pending head's forward goes: its tier topic,
	// and the dead-letter topic of its error's rule, for when the tier
	// refuses it for good. Empty in records of earlier versions.
	Dest string `json:"dest,omitempty"`
	DLQ  string `json:"dlq,omitempty"`
	// Sealed and KeyID are a pending record's value and headers sealed at
	// rest (seal.Pack) and the data key's id, in the JSON form only: a
	// Record read back has them opened into Value and Headers.
	Sealed []byte `json:"sealed,omitempty"`
	KeyID  int64  `json:"key_id,omitempty"`
	// Unreadable says why the record's payload could not be opened for
	// good (its data key destroyed, or tampered with: seal.Unreadable);
	// Value and Headers are then empty. Its owner dead-letters it as a stub
	// with that reason, never publishing it.
	Unreadable error `json:"-"`
}

// New returns the store of group on db (a *pgxpool.Pool).
func New(db DB, group string) *Store { return &Store{db: db, group: group} }

// Migrate creates or upgrades the tables (idempotent, safe concurrently).
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := pgmigrate.Load(migrationFS, "migrations", nil)
	if err != nil {
		return err
	}
	return pgmigrate.Apply(ctx, s.db, "ordering", ms)
}

// State is what Check found for a key.
type State int

const (
	Free    State = iota // no head: process normally
	Head                 // the message is the key's head: process normally (it is being retried)
	Blocked              // another message is the head: park this one
)

func (s *Store) tx(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.db, f)
}

// A key is found by its digest: every statement matches rows with
// key_digest = sha256(key), which the tables' indexes cover whatever the
// key's length (the full key is kept in msg_key).
const byKey = `consumer_group=$1 AND topic=$2 AND key_digest=sha256($3::bytea)`

// lockHead locks K's head row and returns its head key ("" if none).
func (s *Store) lockHead(ctx context.Context, tx pgx.Tx, topic string, key []byte) (string, error) {
	var head string
	err := tx.QueryRow(ctx, `SELECT head_key FROM idem_ordering_heads WHERE `+byKey+` FOR UPDATE`,
		s.group, topic, key).Scan(&head)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return head, err
}

// Park stores r behind K's head if K is blocked by another message. It
// returns Free or Head when the message must be processed instead (nothing is
// stored then), Blocked when it was parked (or was already parked: a
// redelivery). It is one statement (one round trip): the common case, a key
// that is not blocked, costs a primary-key lookup.
func (s *Store) Park(ctx context.Context, r Record) (State, error) {
	return s.ParkCopy(ctx, r, Copy{FromTier: true}, false)
}

// Copy is the record that carries a message to Park: where it was read, and
// whether that is a retry tier (else the source topic).
type Copy struct {
	Topic     string
	Partition int32
	Offset    int64
	FromTier  bool
	// Expired says the copy expired (consumer.Expiry): it is never parked.
	// ParkCopy then only looks: Blocked when the store holds its message
	// (skip it: the stored row has its turn), else Free, or Head for the
	// key's head.
	Expired bool
}

// ParkCopy is Park for the message r read as c. With track (Kafka
// transactions) a row it parks records c until Resolve sees c's offset
// committed, and a row drained meanwhile is kept until then (drained, not
// drainable). A message with a row, parked, marked by a drain or drained, is
// Blocked (skipped as parked): c is a redelivery, of a record whose offset was
// not committed with the transaction that parked it, and the row's drain
// stands (or, reverted, runs again). Only the head's own copy from a tier
// other than the one that parked it (its promoted forward, back) is Head.
//
// With a sealer (Sealed) the statement first runs with no payload and
// inserting nothing, and only a message it finds to park (a key blocked by
// another head: rare) is sealed and parked in a transaction of its own, so
// that its data key cannot be destroyed before the row is written: the
// common case costs the same one statement, and no payload reaches the
// table (or its WAL) in clear.
func (s *Store) ParkCopy(ctx context.Context, r Record, c Copy, track bool) (State, error) {
	if s.sealer == nil {
		f, err := s.park(ctx, s.db, toParkedRow(r), r, c, track, true)
		return f.state(c, err)
	}
	f, err := s.park(ctx, s.db, parkedRow{headerKeys: [][]byte{}, headerValues: [][]byte{}}, r, c, track, false)
	if err != nil || f.has || f.head == nil || f.mine || c.Expired {
		return f.state(c, err)
	}
	err = s.tx(ctx, func(tx pgx.Tx) error {
		k, err := s.sealer.Current(ctx, tx)
		if err != nil {
			return err
		}
		w := toParkedRow(r)
		s.sealRow(k, &w, r.Topic, r.Key)
		f, err = s.park(ctx, tx, w, r, c, track, true)
		return err
	})
	return f.state(c, err)
}

// found is what ParkCopy's statement found for a record r read as a copy
// c: K's head (nil: none), whether that head is r's own record (its
// idempotency key, and its origin unless the head's is not known), whether
// r has a parked row, and whether that row was parked by c.
type found struct {
	head            *string
	mine, has, same bool
}

// park runs ParkCopy's statement for w (the parked row of r read as c) in
// q: it inserts w when the key is blocked by another head (another message,
// or another record with r's idempotency key: BlockAt) and insert is set,
// and returns what it found. A row of r's idempotency key is r's own
// unless that key is the head's: then only a row at r's origin is (a
// duplicate of the head parked behind it is not the head's row).
func (s *Store) park(ctx context.Context, q interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, w parkedRow, r Record, c Copy, track, insert bool) (f found, err error) {
	err = q.QueryRow(ctx, `
		WITH h AS (
			SELECT head_key, head_key = $4 AND (head_offset IS NULL OR (head_partition = $19 AND head_offset = $20)) AS mine
			FROM idem_ordering_heads WHERE `+byKey+` FOR UPDATE
		), p AS (
			SELECT park_topic, park_partition, park_offset FROM idem_ordering_parked WHERE `+byKey+` AND idempotency_key=$4
				AND ("partition" = $19 AND "offset" = $20 OR NOT EXISTS (SELECT 1 FROM h WHERE h.head_key = $4))
		), ins AS (
			INSERT INTO idem_ordering_parked (consumer_group, topic, msg_key, idempotency_key,
				"partition", "offset", record_time, value, header_keys, header_values, park_topic, park_partition, park_offset,
				key_id, sealed)
			SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9,$10, CASE WHEN $14 THEN $11 END, CASE WHEN $14 THEN $12::int END, CASE WHEN $14 THEN $13::bigint END,
				$17, $18
			FROM h WHERE NOT h.mine AND NOT $15 AND $16
			ON CONFLICT DO NOTHING
		)
		SELECT (SELECT head_key FROM h), COALESCE((SELECT mine FROM h), false), EXISTS (SELECT 1 FROM p),
			EXISTS (SELECT 1 FROM p WHERE park_topic=$11 AND park_partition=$12 AND park_offset=$13)`,
		s.group, r.Topic, r.Key, r.IdempotencyKey, w.partition, w.offset, w.ts, w.value, w.headerKeys, w.headerValues,
		c.Topic, c.Partition, c.Offset, track, c.Expired, insert, w.keyID, w.sealed, r.Partition, r.Offset).Scan(&f.head, &f.mine, &f.has, &f.same)
	return f, err
}

// state is ParkCopy's answer for what park found (err: its error).
func (f found) state(c Copy, err error) (State, error) {
	switch {
	case err != nil:
		return Free, fmt.Errorf("keyorder: park: %w", err)
	case f.has && (f.head == nil || !f.mine || !c.FromTier || f.same):
		return Blocked, nil
	case f.head == nil:
		return Free, nil
	case f.mine:
		return Head, nil
	case c.Expired: // not held, and not parked
		return Free, nil
	}
	return Blocked, nil
}

// Block makes ikey the head of K before it is forwarded to a retry tier of
// unknown number; see BlockTier.
func (s *Store) Block(ctx context.Context, topic string, key []byte, ikey string) error {
	return s.BlockTier(ctx, topic, key, ikey, 0)
}

// BlockTier makes ikey the head of K before it is forwarded to retry tier
// tier (0: not known) and records that tier, the head's origin not known:
// see BlockAt.
func (s *Store) BlockTier(ctx context.Context, topic string, key []byte, ikey string, tier int) error {
	return s.BlockAt(ctx, topic, key, ikey, Origin{Partition: -1, Offset: -1}, tier)
}

// Origin is where a record was first produced in its source topic: the
// partition and offset every copy of it (a retry tier's, a parked row)
// carries. Offset -1: not known.
type Origin struct {
	Partition int32
	Offset    int64
}

// known reports whether o names a record.
func (o Origin) known() bool { return o.Offset >= 0 }

// BlockAt makes the record at origin at, with idempotency key ikey, the
// head of K before it is forwarded to retry tier tier (0: not known), and
// records that tier. It is a no-op, apart from the tier, when that record
// already is the head (a head whose origin was not known takes at). It
// fails with ErrOtherHead when another message is the head (a message of K
// that was not parked failed while another became the head: two copies of
// one message, or two partitions carrying one key), and when another record
// with the same idempotency key is (a producer's duplicate of the head: it
// goes to its tier anyway, and is parked behind the head when it comes
// back). It is one statement.
//
// The head is one record, not one idempotency key: ParkCopy takes only a
// copy of the record at at for the head. A head of unknown origin (at's
// Offset -1, BlockTier, or a head a revert restored from a Mark without
// HeadAt) is any record with its idempotency key, as before heads knew their
// origin.
func (s *Store) BlockAt(ctx context.Context, topic string, key []byte, ikey string, at Origin, tier int) error {
	var p, o *int64
	if at.known() {
		pp, oo := int64(at.Partition), at.Offset
		p, o = &pp, &oo
	}
	var head string
	var mine bool
	err := s.db.QueryRow(ctx, `INSERT INTO idem_ordering_heads AS h (consumer_group, topic, msg_key, head_key, tier, head_partition, head_offset)
		VALUES ($1,$2,$3,$4,$5,$6,$7)
		ON CONFLICT (consumer_group, topic, key_digest) DO UPDATE
			SET tier = CASE WHEN h.head_key = EXCLUDED.head_key AND EXCLUDED.tier > 0 THEN EXCLUDED.tier ELSE h.tier END,
				head_partition = CASE WHEN h.head_key = EXCLUDED.head_key AND h.head_offset IS NULL THEN EXCLUDED.head_partition ELSE h.head_partition END,
				head_offset = CASE WHEN h.head_key = EXCLUDED.head_key AND h.head_offset IS NULL THEN EXCLUDED.head_offset ELSE h.head_offset END
		RETURNING head_key, (head_key = $4 AND (head_offset IS NULL OR $7::bigint IS NULL OR (head_partition = $6 AND head_offset = $7)))`,
		s.group, topic, key, ikey, tier, p, o).Scan(&head, &mine)
	if err != nil {
		return fmt.Errorf("keyorder: block: %w", err)
	}
	if !mine {
		return fmt.Errorf("keyorder: block: %w: %q", ErrOtherHead, head)
	}
	return nil
}

// ErrOtherHead is returned by Block, BlockTier and Promote when another
// message is K's head: a logical conflict between two workers handling the
// same key at once, never an outage; retrying the call cannot succeed.
var ErrOtherHead = errors.New("keyorder: another message is the head")

// Next returns the oldest message parked behind head ikey, or, when none is
// left, unblocks K and returns ok=false. Rows marked done in a Kafka
// transaction (DoneAt, PromoteAt) are not returned. It also returns ok=false (changing
// nothing) when ikey is not K's head.
func (s *Store) Next(ctx context.Context, topic string, key []byte, ikey string) (r Record, ok bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		head, err := s.lockHead(ctx, tx, topic, key)
		if err != nil || head != ikey {
			return err
		}
		var w parkedRow
		err = tx.QueryRow(ctx, `SELECT `+parkedCols+` FROM idem_ordering_parked WHERE `+byKey+` AND mark_topic IS NULL AND NOT drained ORDER BY seq LIMIT 1`,
			s.group, topic, key).Scan(w.dest()...)
		if errors.Is(err, pgx.ErrNoRows) {
			_, err = tx.Exec(ctx, `DELETE FROM idem_ordering_heads WHERE `+byKey, s.group, topic, key)
			return err
		}
		if err != nil {
			return err
		}
		r, err = s.restore(ctx, w, topic, key)
		ok = err == nil
		return err
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("keyorder: next: %w", err)
	}
	return r, ok, nil
}

// Done removes a parked message that reached a final outcome (processed,
// duplicate or dead-lettered) while draining. Removing one that is gone is a
// no-op.
func (s *Store) Done(ctx context.Context, seq int64) error { return s.DoneAt(ctx, seq, nil) }

// DoneAt is Done for a parked message whose outcome rides in the Kafka
// transaction m names (its dead-letter copy): the row is marked with m, not
// removed; Next skips it and Resolve removes it once m is committed, or
// parks it again when m is not. A nil m is Done. It fails with ErrFenced,
// changing nothing, when m.Owner lost the partition to a later Claim.
func (s *Store) DoneAt(ctx context.Context, seq int64, m *Mark) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if err := s.fence(ctx, tx, m); err != nil {
			return err
		}
		return removeParked(ctx, tx, seq, m)
	})
	if err != nil {
		return fmt.Errorf("keyorder: done: %w", err)
	}
	return nil
}

// Promote makes the parked message r (its record, at r's origin: BlockAt)
// the head of K in place of oldHead and
// records r (with its failure, its r.Tier) as pending forward, in one
// transaction. It fails with ErrOtherHead, changing nothing, when oldHead is
// no longer K's head (another worker promoted or released it first).
func (s *Store) Promote(ctx context.Context, oldHead string, r Record) error {
	return s.PromoteAt(ctx, oldHead, r, nil)
}

// PromoteAt is Promote for a promotion whose forward rides in the Kafka
// transaction m names: the head row and r's parked row are marked with m
// (the head row keeps the head it had before m's first promotion, and that
// head's origin), so that
// Resolve can revert the promotion when m is not committed; the pending
// forward is cleared by Resolve once m is committed (Forwarded leaves a
// marked head alone). A nil m is Promote. It fails with ErrFenced, changing
// nothing, when m.Owner lost the partition to a later Claim.
func (s *Store) PromoteAt(ctx context.Context, oldHead string, r Record, m *Mark) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		if err := s.fence(ctx, tx, m); err != nil {
			return err
		}
		head, err := s.lockHead(ctx, tx, r.Topic, r.Key)
		if err != nil {
			return err
		}
		pending, err := s.encodePending(ctx, tx, r)
		if err != nil {
			return err
		}
		if head != oldHead {
			return fmt.Errorf("%w: %q", ErrOtherHead, head)
		}
		var mt *string
		var mp *int32
		var mo *int64
		if m != nil {
			mt, mp, mo = &m.Topic, &m.Partition, &m.Offset
		}
		// The columns are set from their old values (SQL's UPDATE reads
		// every right-hand side from the row before it).
		if _, err := tx.Exec(ctx, `UPDATE idem_ordering_heads SET head_key=$4, pending=$5, tier=$6, since=now(),
				head_partition=$10, head_offset=$11,
				revert_head = CASE WHEN $7::text IS NULL THEN NULL
					WHEN mark_topic = $7 AND mark_partition = $8 AND mark_offset = $9 THEN revert_head
					ELSE head_key END,
				revert_partition = CASE WHEN $7::text IS NULL THEN NULL
					WHEN mark_topic = $7 AND mark_partition = $8 AND mark_offset = $9 THEN revert_partition
					ELSE head_partition END,
				revert_offset = CASE WHEN $7::text IS NULL THEN NULL
					WHEN mark_topic = $7 AND mark_partition = $8 AND mark_offset = $9 THEN revert_offset
					ELSE head_offset END,
				mark_topic=$7, mark_partition=$8, mark_offset=$9
			WHERE `+byKey, s.group, r.Topic, r.Key, r.IdempotencyKey, pending, r.Tier, mt, mp, mo, r.Partition, r.Offset); err != nil {
			return err
		}
		return removeParked(ctx, tx, r.Seq, m)
	})
	if err != nil {
		return fmt.Errorf("keyorder: promote: %w", err)
	}
	return nil
}

// Parked counts the messages parked for group (a metric and test aid).
func (s *Store) Parked(ctx context.Context) (int, error) {
	var n int
	err := s.tx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM idem_ordering_parked WHERE consumer_group=$1 AND NOT drained`, s.group).Scan(&n)
	})
	return n, err
}

// Package keyorder keeps per-key order while a message sits in a retry tier
// (consumer.OrderingByKey). It is internal: the consumer wires it.
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
package keyorder

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// DB is what the store needs; *pgxpool.Pool satisfies it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Store is the per-key ordering state of one consumer group.
type Store struct {
	db    DB
	group string
}

// Header is one record header.
type Header struct {
	Key   string `json:"k"`
	Value []byte `json:"v"`
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
	// Attempt, Error, Kind describe the failure of a pending head.
	Attempt int    `json:"attempt,omitempty"`
	Tier    int    `json:"tier,omitempty"`
	Error   string `json:"error,omitempty"`
}

// New returns the store of group on db (a *pgxpool.Pool).
func New(db DB, group string) *Store { return &Store{db: db, group: group} }

// Migrate creates the tables (idempotent, safe concurrently).
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

// lockHead locks K's head row and returns its head key ("" if none).
func (s *Store) lockHead(ctx context.Context, tx pgx.Tx, topic string, key []byte) (string, error) {
	var head string
	err := tx.QueryRow(ctx, `SELECT head_key FROM idem_ordering_heads
		WHERE consumer_group=$1 AND topic=$2 AND msg_key=$3 FOR UPDATE`, s.group, topic, key).Scan(&head)
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
	hs, err := json.Marshal(r.Headers)
	if err != nil {
		return Free, fmt.Errorf("keyorder: park: %w", err)
	}
	var head string
	err = s.db.QueryRow(ctx, `
		WITH h AS (
			SELECT head_key FROM idem_ordering_heads
			WHERE consumer_group=$1 AND topic=$2 AND msg_key=$3 FOR UPDATE
		), ins AS (
			INSERT INTO idem_ordering_parked
				(consumer_group, topic, msg_key, idempotency_key, "partition", "offset", record_time, value, headers)
			SELECT $1,$2,$3,$4,$5,$6,$7,$8,$9 FROM h WHERE h.head_key <> $4
			ON CONFLICT DO NOTHING
		)
		SELECT head_key FROM h`,
		s.group, r.Topic, r.Key, r.IdempotencyKey, r.Partition, r.Offset, r.Timestamp, r.Value, hs).Scan(&head)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Free, nil
	case err != nil:
		return Free, fmt.Errorf("keyorder: park: %w", err)
	case head == r.IdempotencyKey:
		return Head, nil
	}
	return Blocked, nil
}

// Block makes ikey the head of K before it is forwarded to a retry tier. It is
// a no-op when ikey already is the head. It fails with ErrOtherHead when
// another message is the head (the caller should have parked).
func (s *Store) Block(ctx context.Context, topic string, key []byte, ikey string) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO idem_ordering_heads (consumer_group, topic, msg_key, head_key)
			VALUES ($1,$2,$3,$4) ON CONFLICT DO NOTHING`, s.group, topic, key, ikey)
		if err != nil {
			return err
		}
		head, err := s.lockHead(ctx, tx, topic, key)
		if err != nil {
			return err
		}
		if head != ikey {
			return fmt.Errorf("%w: %q", ErrOtherHead, head)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("keyorder: block: %w", err)
	}
	return nil
}

// ErrOtherHead is returned by Block when another message is K's head.
var ErrOtherHead = errors.New("keyorder: another message is the head")

// Next returns the oldest message parked behind head ikey, or, when none is
// left, unblocks K and returns ok=false. It also returns ok=false (changing
// nothing) when ikey is not K's head.
func (s *Store) Next(ctx context.Context, topic string, key []byte, ikey string) (r Record, ok bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		head, err := s.lockHead(ctx, tx, topic, key)
		if err != nil || head != ikey {
			return err
		}
		var hs []byte
		err = tx.QueryRow(ctx, `SELECT seq, idempotency_key, "partition", "offset", record_time, value, headers
			FROM idem_ordering_parked WHERE consumer_group=$1 AND topic=$2 AND msg_key=$3 ORDER BY seq LIMIT 1`,
			s.group, topic, key).Scan(&r.Seq, &r.IdempotencyKey, &r.Partition, &r.Offset, &r.Timestamp, &r.Value, &hs)
		if errors.Is(err, pgx.ErrNoRows) {
			_, err = tx.Exec(ctx, `DELETE FROM idem_ordering_heads WHERE consumer_group=$1 AND topic=$2 AND msg_key=$3`, s.group, topic, key)
			return err
		}
		if err != nil {
			return err
		}
		r.Topic, r.Key, ok = topic, key, true
		return json.Unmarshal(hs, &r.Headers)
	})
	if err != nil {
		return Record{}, false, fmt.Errorf("keyorder: next: %w", err)
	}
	return r, ok, nil
}

// Done removes a parked message that reached a final outcome (processed,
// duplicate or dead-lettered) while draining.
func (s *Store) Done(ctx context.Context, seq int64) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM idem_ordering_parked WHERE seq=$1`, seq)
		return err
	})
}

// Promote makes the parked message r the head of K in place of oldHead and
// records r (with its failure) as pending forward, in one transaction.
func (s *Store) Promote(ctx context.Context, oldHead string, r Record) error {
	pending, err := json.Marshal(r)
	if err != nil {
		return err
	}
	err = s.tx(ctx, func(tx pgx.Tx) error {
		head, err := s.lockHead(ctx, tx, r.Topic, r.Key)
		if err != nil {
			return err
		}
		if head != oldHead {
			return fmt.Errorf("%w: %q", ErrOtherHead, head)
		}
		if _, err := tx.Exec(ctx, `UPDATE idem_ordering_heads SET head_key=$4, pending=$5, since=now()
			WHERE consumer_group=$1 AND topic=$2 AND msg_key=$3`, s.group, r.Topic, r.Key, r.IdempotencyKey, pending); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM idem_ordering_parked WHERE seq=$1`, r.Seq)
		return err
	})
	if err != nil {
		return fmt.Errorf("keyorder: promote: %w", err)
	}
	return nil
}

// Forwarded clears K's pending forward once it is acked.
func (s *Store) Forwarded(ctx context.Context, topic string, key []byte, ikey string) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE idem_ordering_heads SET pending=NULL
			WHERE consumer_group=$1 AND topic=$2 AND msg_key=$3 AND head_key=$4`, s.group, topic, key, ikey)
		return err
	})
}

// Pending returns the heads whose forward a crash interrupted, for topics.
func (s *Store) Pending(ctx context.Context, topics []string) ([]Record, error) {
	var out []Record
	err := s.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `SELECT pending FROM idem_ordering_heads
			WHERE consumer_group=$1 AND topic = ANY($2) AND pending IS NOT NULL`, s.group, topics)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				return err
			}
			var r Record
			if err := json.Unmarshal(b, &r); err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("keyorder: pending: %w", err)
	}
	return out, nil
}

// Parked counts the messages parked for group (a metric and test aid).
func (s *Store) Parked(ctx context.Context) (int, error) {
	var n int
	err := s.tx(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT count(*) FROM idem_ordering_parked WHERE consumer_group=$1`, s.group).Scan(&n)
	})
	return n, err
}

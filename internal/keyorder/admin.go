package keyorder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// BlockedKey is one blocked key as List reports it: its head, if it has one, and
// the messages parked behind it.
type BlockedKey struct {
	Group string
	Topic string // the source topic
	Key   []byte // the Kafka key
	// Head is the idempotency key of the message the key waits for; "" when
	// only parked rows are left (no head row: they are never drained).
	Head string
	// Tier is the retry tier the head was last sent to; 0 when not known.
	Tier int
	// Since is when the head became the head (zero without a head).
	Since time.Time
	// Pending says the head's forward to its tier was interrupted (a crash or
	// a revoke) and is still to be done.
	Pending bool
	// Parked counts the messages parked behind the head.
	Parked int
	// OldestParked is when the oldest of them was parked (zero when none).
	OldestParked time.Time
}

// List returns the blocked keys of group and topic ("" matches every group or
// every topic), ordered by group, topic and oldest parked message. It reads
// only; db needs no Store.
func List(ctx context.Context, db DB, group, topic string) ([]BlockedKey, error) {
	var out []BlockedKey
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `
			WITH p AS (
				SELECT consumer_group, topic, key_digest, (array_agg(msg_key))[1] AS msg_key,
					count(*) AS n, min(parked_at) AS oldest
				FROM idem_ordering_parked
				WHERE ($1 = '' OR consumer_group = $1) AND ($2 = '' OR topic = $2) AND NOT drained
				GROUP BY consumer_group, topic, key_digest
			), h AS (
				SELECT consumer_group, topic, key_digest, msg_key, head_key, tier, since, pending IS NOT NULL AS pending
				FROM idem_ordering_heads
				WHERE ($1 = '' OR consumer_group = $1) AND ($2 = '' OR topic = $2)
			)
			SELECT coalesce(h.consumer_group, p.consumer_group), coalesce(h.topic, p.topic),
				coalesce(h.msg_key, p.msg_key), coalesce(h.head_key, ''), coalesce(h.tier, 0), h.since,
				coalesce(h.pending, false), coalesce(p.n, 0), p.oldest
			FROM h FULL JOIN p ON h.consumer_group = p.consumer_group AND h.topic = p.topic AND h.key_digest = p.key_digest
			ORDER BY 1, 2, p.oldest NULLS LAST, h.since`, group, topic)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var b BlockedKey
			var since, oldest *time.Time
			if err := rows.Scan(&b.Group, &b.Topic, &b.Key, &b.Head, &b.Tier, &since, &b.Pending, &b.Parked, &oldest); err != nil {
				return err
			}
			if since != nil {
				b.Since = *since
			}
			if oldest != nil {
				b.OldestParked = *oldest
			}
			out = append(out, b)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("keyorder: list: %w", err)
	}
	return out, nil
}

// Release gives up K's ordering: in one transaction holding K's head row, it
// hands send, in order, the head's pending forward if there is one (a
// promoted message not yet in its tier) and then every parked message, and,
// once send accepted all of them, deletes them and the head. When send fails
// the transaction rolls back and nothing is deleted; records already sent are
// sent again by the next Release (their idempotency keys make the copies
// duplicates). A worker that parks or drains K meanwhile waits for the lock.
// It returns how many records send accepted.
func (s *Store) Release(ctx context.Context, topic string, key []byte, send func(Record) error) (int, error) {
	n := 0
	err := s.tx(ctx, func(tx pgx.Tx) error {
		n = 0
		var pending []byte
		err := tx.QueryRow(ctx, `SELECT pending FROM idem_ordering_heads WHERE `+byKey+` FOR UPDATE`,
			s.group, topic, key).Scan(&pending)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		var recs []Record
		if pending != nil {
			r, err := s.decodePending(ctx, pending)
			if err != nil {
				return err
			}
			recs = append(recs, r)
		}
		rows, err := tx.Query(ctx, `SELECT `+parkedCols+` FROM idem_ordering_parked WHERE `+byKey+` AND NOT drained ORDER BY seq FOR UPDATE`,
			s.group, topic, key)
		if err != nil {
			return err
		}
		parked, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Record, error) {
			var w parkedRow
			if err := row.Scan(w.dest()...); err != nil {
				return Record{}, err
			}
			return s.restore(ctx, w, topic, key)
		})
		if err != nil {
			return err
		}
		recs = append(recs, parked...)
		for _, r := range recs {
			if err := send(r); err != nil {
				return fmt.Errorf("send %q (offset %d): %w", r.IdempotencyKey, r.Offset, err)
			}
			n++
		}
		if _, err := tx.Exec(ctx, `DELETE FROM idem_ordering_parked WHERE `+byKey, s.group, topic, key); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `DELETE FROM idem_ordering_heads WHERE `+byKey, s.group, topic, key)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("keyorder: release: %w", err)
	}
	return n, nil
}

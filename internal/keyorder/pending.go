package keyorder

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Forwarded clears K's pending forward once it is acked. A head promoted in
// a Kafka transaction (PromoteAt) is left alone: Resolve clears it once the
// transaction is committed.
func (s *Store) Forwarded(ctx context.Context, topic string, key []byte, ikey string) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE idem_ordering_heads SET pending=NULL WHERE `+byKey+` AND head_key=$4 AND mark_topic IS NULL`,
			s.group, topic, key, ikey)
		return err
	})
	if err != nil {
		return fmt.Errorf("keyorder: forwarded: %w", err)
	}
	return nil
}

// Pending returns the heads whose forward a crash or a revoke interrupted,
// for topics.
func (s *Store) Pending(ctx context.Context, topics []string) ([]Record, error) {
	return s.pending(ctx, `SELECT pending FROM idem_ordering_heads
		WHERE consumer_group=$1 AND topic = ANY($2) AND pending IS NOT NULL`, s.group, topics)
}

// PendingOf returns the heads of topic whose forward a crash or a revoke
// interrupted and that came from partition: what the new owner of that
// partition (of topic or of one of its tiers) must forward. Heads promoted
// in a Kafka transaction (PromoteAt) are not listed: Resolve settles them.
func (s *Store) PendingOf(ctx context.Context, topic string, partition int32) ([]Record, error) {
	return s.pending(ctx, `SELECT pending FROM idem_ordering_heads
		WHERE consumer_group=$1 AND topic=$2 AND pending IS NOT NULL AND (pending->>'partition')::int = $3
			AND mark_topic IS NULL`,
		s.group, topic, partition)
}

func (s *Store) pending(ctx context.Context, q string, args ...any) ([]Record, error) {
	var out []Record
	err := s.tx(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		bs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			return err
		}
		for _, b := range bs {
			r, err := s.decodePending(ctx, b)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("keyorder: pending: %w", err)
	}
	return out, nil
}

// ClaimPending leases the pending forward of K's head ikey to the caller
// for lease, so that one claim at a time recovers it (the claims of a source
// partition and of its tiers may run at once, on one member or on two): ok
// when the caller holds the lease now. held reports that the forward is
// still pending under another caller's unexpired lease: wait and ask again.
// Neither: it is no longer pending (recovered meanwhile), or the head moved
// on. The lease is a time in the pending record's JSON
// ("recovering_until", unix seconds by the database's clock); Forwarded,
// and the head row's removal, end it with the pending forward.
func (s *Store) ClaimPending(ctx context.Context, topic string, key []byte, ikey string, lease time.Duration) (ok, held bool, err error) {
	err = s.tx(ctx, func(tx pgx.Tx) error {
		head, err := s.lockHead(ctx, tx, topic, key)
		if err != nil || head != ikey {
			return err
		}
		var free *bool
		err = tx.QueryRow(ctx, `SELECT coalesce((pending->>'recovering_until')::float8, 0) < extract(epoch from now())
			FROM idem_ordering_heads WHERE `+byKey+` AND pending IS NOT NULL AND mark_topic IS NULL`,
			s.group, topic, key).Scan(&free)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		case free == nil || !*free:
			held = true
			return nil
		}
		_, err = tx.Exec(ctx, `UPDATE idem_ordering_heads
			SET pending = jsonb_set(pending, '{recovering_until}', to_jsonb(extract(epoch from now()) + $4::float8))
			WHERE `+byKey, s.group, topic, key, lease.Seconds())
		ok = err == nil
		return err
	})
	if err != nil {
		return false, false, fmt.Errorf("keyorder: claim pending: %w", err)
	}
	return ok, held, nil
}

// ReleasePending ends a lease ClaimPending gave on K's head ikey, its
// forward still pending (the recovery stopped): the next claim takes it at
// once.
func (s *Store) ReleasePending(ctx context.Context, topic string, key []byte, ikey string) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `UPDATE idem_ordering_heads SET pending = pending - 'recovering_until'
			WHERE `+byKey+` AND head_key=$4 AND pending IS NOT NULL`, s.group, topic, key, ikey)
		return err
	})
	if err != nil {
		return fmt.Errorf("keyorder: release pending: %w", err)
	}
	return nil
}

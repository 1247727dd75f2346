package keyorder

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// OwedHook is a hook a forward in a Kafka transaction owes (the consumer's
// OnDeadLettered with Transactions): it may run only once the transaction
// that carries the forward has committed. Like a drain's steps (Mark), the
// row is marked with the source offset whose commit carries the forward:
// committed iff the group's committed offset of Mark's partition is above
// Mark.Offset (Mark.Head is unused).
type OwedHook struct {
	// Key is the hook's inbox key: one row per message and hook.
	Key  string
	Mark Mark
	// Payload is what the hook is called with, as the consumer encodes it.
	Payload []byte
}

// OweHooks records hooks, each replacing an earlier row of its key, in one
// transaction, before their forwards are sent. A hook whose Mark.Owner lost
// its partition to a later Claim fails them all with ErrFenced.
func (s *Store) OweHooks(ctx context.Context, hooks []OwedHook) error {
	if len(hooks) == 0 {
		return nil
	}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		for i, h := range hooks {
			if i == 0 || h.Mark.Owner != hooks[i-1].Mark.Owner || h.Mark.Topic != hooks[i-1].Mark.Topic || h.Mark.Partition != hooks[i-1].Mark.Partition {
				if err := s.fence(ctx, tx, &h.Mark); err != nil {
					return err
				}
			}
			if _, err := tx.Exec(ctx, `INSERT INTO idem_txn_hooks (consumer_group, hook_key, mark_topic, mark_partition, mark_offset, payload)
				VALUES ($1, $2, $3, $4, $5, $6)
				ON CONFLICT (consumer_group, hook_key) DO UPDATE
				SET mark_topic=excluded.mark_topic, mark_partition=excluded.mark_partition, mark_offset=excluded.mark_offset, payload=excluded.payload`,
				s.group, h.Key, h.Mark.Topic, h.Mark.Partition, h.Mark.Offset, h.Payload); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("keyorder: owe hooks: %w", err)
	}
	return nil
}

// ClaimHooks settles the owed hooks marked on a claimed partition by the
// offset the claim starts from, c.Offset (its committed offset): the rows at
// or above it belong to transactions that did not commit (their message is
// read again) and are removed; the rows below it were committed, and their
// hooks are returned, oldest mark first, to be run (HookRan removes each).
func (s *Store) ClaimHooks(ctx context.Context, c Committed) ([]OwedHook, error) {
	var out []OwedHook
	err := s.tx(ctx, func(tx pgx.Tx) error {
		out = out[:0]
		if _, err := tx.Exec(ctx, `DELETE FROM idem_txn_hooks WHERE consumer_group=$1 AND mark_topic=$2 AND mark_partition=$3 AND mark_offset >= $4`,
			s.group, c.Topic, c.Partition, c.Offset); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `SELECT hook_key, mark_offset, payload FROM idem_txn_hooks
			WHERE consumer_group=$1 AND mark_topic=$2 AND mark_partition=$3 ORDER BY mark_offset, created_at`,
			s.group, c.Topic, c.Partition)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			h := OwedHook{Mark: Mark{Topic: c.Topic, Partition: c.Partition}}
			if err := rows.Scan(&h.Key, &h.Mark.Offset, &h.Payload); err != nil {
				return err
			}
			out = append(out, h)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("keyorder: claim hooks: %w", err)
	}
	return out, nil
}

// HookRan removes the owed hook of key: it has run.
func (s *Store) HookRan(ctx context.Context, key string) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `DELETE FROM idem_txn_hooks WHERE consumer_group=$1 AND hook_key=$2`, s.group, key)
		return err
	})
	if err != nil {
		return fmt.Errorf("keyorder: hook ran: %w", err)
	}
	return nil
}

package keyorder

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrFenced is wrapped by the error of a marked step (DoneAt, PromoteAt,
// OweHooks) whose Mark.Owner is no longer its partition's owner: another
// claim of the partition (Claim) came since, so the member that made the
// mark lost the partition and its Kafka transaction cannot commit. Nothing
// is written; the member must stop working on the partition.
var ErrFenced = errors.New("keyorder: the partition was claimed by another owner since this mark's claim")

// Claim makes owner (a token unique to one claim of the partition) the owner
// of topic/partition for the group, in place of any earlier one: from now
// on a marked step whose Mark.Owner is another token fails with ErrFenced.
// It waits for a marked step of the previous owner that is under way, so
// that step is either written before the claim (and Resolve with claim
// settles it by the committed offset) or refused. Run it before Resolve
// with claim.
func (s *Store) Claim(ctx context.Context, topic string, partition int32, owner string) error {
	err := s.tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO idem_ordering_claims (consumer_group, topic, partition, owner)
			VALUES ($1, $2, $3, $4)
			ON CONFLICT (consumer_group, topic, partition) DO UPDATE SET owner=excluded.owner, claimed_at=now()`,
			s.group, topic, partition, owner)
		return err
	})
	if err != nil {
		return fmt.Errorf("keyorder: claim: %w", err)
	}
	return nil
}

// fence fails with ErrFenced when m names an owner (Mark.Owner) that is no
// longer its partition's: a later Claim replaced it (or none was made). It
// holds the claim row until tx ends, so a Claim waits for tx. A nil m, or
// one without an owner, is not fenced.
func (s *Store) fence(ctx context.Context, tx pgx.Tx, m *Mark) error {
	if m == nil || m.Owner == "" {
		return nil
	}
	var owner string
	err := tx.QueryRow(ctx, `SELECT owner FROM idem_ordering_claims
		WHERE consumer_group=$1 AND topic=$2 AND partition=$3 FOR SHARE`, s.group, m.Topic, m.Partition).Scan(&owner)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w (%s/%d: no claim recorded)", ErrFenced, m.Topic, m.Partition)
	case err != nil:
		return err
	case owner != m.Owner:
		return fmt.Errorf("%w (%s/%d)", ErrFenced, m.Topic, m.Partition)
	}
	return nil
}

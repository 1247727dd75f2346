package keyorder

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Mark names the Kafka transaction that carries a drain's forwards
// (consumer.Config.Transactions): the drain runs while the message at Offset
// of Topic/Partition (a source or retry-tier partition of the group) is
// settled, and every forward of the drain commits in the transaction that
// commits that message's offset. So the forwards are committed iff the
// group's committed offset of Topic/Partition is above Offset, and nothing
// else needs recording in Kafka. Head is that message's idempotency key: the
// head whose parked messages the drain ran, behind which a revert parks them
// again; HeadAt is that message's origin (nil: not known), so that a revert
// that blocks the key again makes that one record its head (BlockAt), not
// any record with Head's idempotency key.
//
// Owner is the token of the claim of Topic/Partition that made the mark
// (Claim): a marked step whose owner was replaced by a later claim is
// refused with ErrFenced, so a member that lost the partition (a zombie,
// frozen past its session timeout) writes no mark its successor could take
// for its own. "" is not fenced.
type Mark struct {
	Topic     string
	Partition int32
	Offset    int64
	Head      string
	HeadAt    *Origin
	Owner     string
}

// Committed is a partition's committed offset for the group (the next offset
// to read; 0 when none is committed).
type Committed struct {
	Topic     string
	Partition int32
	Offset    int64
}

// removeParked removes parked row seq, or, with m, marks it done in m.
func removeParked(ctx context.Context, tx pgx.Tx, seq int64, m *Mark) error {
	if m == nil {
		_, err := tx.Exec(ctx, `DELETE FROM idem_ordering_parked WHERE seq=$1`, seq)
		return err
	}
	var hp *int32
	var ho *int64
	if m.HeadAt != nil && m.HeadAt.known() {
		hp, ho = &m.HeadAt.Partition, &m.HeadAt.Offset
	}
	_, err := tx.Exec(ctx, `UPDATE idem_ordering_parked SET mark_topic=$2, mark_partition=$3, mark_offset=$4, mark_head=$5,
			mark_head_partition=$6, mark_head_offset=$7 WHERE seq=$1`,
		seq, m.Topic, m.Partition, m.Offset, m.Head, hp, ho)
	return err
}

// committedRows are the partitions and committed offsets of Resolve's $2,
// $3 and $4, as c; marksOf matches a table x's rows marked on them.
const (
	committedRows = `unnest($2::text[], $3::int[], $4::bigint[]) AS c(t, p, o)`
	marksOf       = ` x.consumer_group=$1 AND x.mark_topic=c.t AND x.mark_partition=c.p`
)

// Resolve settles the marks (Mark) of the partitions in committed by their
// committed offsets, in one PostgreSQL transaction; it is the one path that
// ends a mark, run after each Kafka commit (claim false: the offsets just
// committed) and when a partition is claimed (claim true: the offset the
// claim starts from).
//
// A mark below its partition's committed offset was committed: its parked
// rows are drained and its heads' pending forwards cleared. A parked row's
// record (ParkCopy's track) below it is committed; a drained row whose record
// is committed (or untracked) is removed. With claim, a
// mark at or above it was not (the transaction aborted, or its member died
// before the commit), and the message at the mark is read again from there:
// its marked heads get back the head they had before the drain, and its
// marked parked rows are parked again behind the mark's head (whose
// redelivery drains them again), blocking their key behind it — that one
// record, at the mark's HeadAt — if the key was
// unblocked meanwhile — but never in place of another head: a message of the
// key that became the head since keeps it, and the rows wait behind it.
// Without claim, marks at or above the offset belong to transactions still
// open and are left alone.
func (s *Store) Resolve(ctx context.Context, committed []Committed, claim bool) error {
	if len(committed) == 0 {
		return nil
	}
	ts, ps, os := make([]string, len(committed)), make([]int32, len(committed)), make([]int64, len(committed))
	for i, c := range committed {
		ts[i], ps[i], os[i] = c.Topic, c.Partition, c.Offset
	}
	args := []any{s.group, ts, ps, os}
	stmts := []string{
		`UPDATE idem_ordering_parked x SET drained=true, mark_topic=NULL, mark_partition=NULL, mark_offset=NULL, mark_head=NULL,
				mark_head_partition=NULL, mark_head_offset=NULL
			FROM ` + committedRows + ` WHERE` + marksOf + ` AND x.mark_offset < c.o`,
		`UPDATE idem_ordering_parked x SET park_topic=NULL, park_partition=NULL, park_offset=NULL
			FROM ` + committedRows + ` WHERE x.consumer_group=$1 AND x.park_topic=c.t AND x.park_partition=c.p AND x.park_offset < c.o`,

		`UPDATE idem_ordering_heads x SET pending=NULL, mark_topic=NULL, mark_partition=NULL, mark_offset=NULL,
				revert_head=NULL, revert_partition=NULL, revert_offset=NULL
			FROM ` + committedRows + ` WHERE` + marksOf + ` AND x.mark_offset < c.o`,
	}
	if claim {
		stmts = append(stmts,
			`UPDATE idem_ordering_heads x SET head_key=x.revert_head, head_partition=x.revert_partition, head_offset=x.revert_offset,
				pending=NULL, tier=0, since=now(),
				mark_topic=NULL, mark_partition=NULL, mark_offset=NULL, revert_head=NULL, revert_partition=NULL, revert_offset=NULL
			FROM `+committedRows+` WHERE`+marksOf+` AND x.mark_offset >= c.o`,
			`INSERT INTO idem_ordering_heads (consumer_group, topic, msg_key, head_key, head_partition, head_offset)
			SELECT DISTINCT ON (x.topic, x.key_digest) $1, x.topic, x.msg_key, x.mark_head, x.mark_head_partition, x.mark_head_offset
			FROM idem_ordering_parked x, `+committedRows+` WHERE`+marksOf+` AND x.mark_offset >= c.o
			ORDER BY x.topic, x.key_digest, x.seq
			ON CONFLICT (consumer_group, topic, key_digest) DO NOTHING`,
			`UPDATE idem_ordering_parked x SET mark_topic=NULL, mark_partition=NULL, mark_offset=NULL, mark_head=NULL,
				mark_head_partition=NULL, mark_head_offset=NULL
			FROM `+committedRows+` WHERE`+marksOf+` AND x.mark_offset >= c.o`,
		)
	}
	err := s.tx(ctx, func(tx pgx.Tx) error {
		for _, q := range stmts {
			if _, err := tx.Exec(ctx, q, args...); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `DELETE FROM idem_ordering_parked WHERE consumer_group=$1 AND drained AND park_topic IS NULL`, s.group)
		return err
	})
	if err != nil {
		return fmt.Errorf("keyorder: resolve: %w", err)
	}
	return nil
}

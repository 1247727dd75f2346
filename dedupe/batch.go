package dedupe

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// BatchStore is a Store that records several messages in one unit of work:
// one round trip finds which keys are new, fn runs once for all of them, and
// one commit records them with fn's effects. consumer uses it when
// Config.Batch is set; a Store without it is called once per message.
//
// Implementations must be safe for concurrent use.
type BatchStore interface {
	Store
	// ProcessBatch records recs (all of one Group) in one unit of work. It
	// finds the records whose key has not been recorded yet — the first of
	// several records with one key counts, the others are duplicates — and
	// calls fn with their indices into recs, in order, and a ctx carrying the
	// unit's transaction (Tx(ctx)). fn is not called when no record is new.
	// If fn returns nil the unit commits and outs[i] is Processed for the new
	// records and Duplicate for the others; otherwise nothing is recorded and
	// fn's error is returned unchanged. Store failures are *StoreError values,
	// as in Process.
	ProcessBatch(ctx context.Context, recs []Record, fn func(ctx context.Context, fresh []int) error) (outs []Outcome, err error)
}

var (
	_ BatchStore = (*Postgres)(nil)
	_ BatchStore = (*Memory)(nil)
)

// firstOfEachKey returns, for recs, the index of the first record of each key
// in order, and marks the others Duplicate in outs.
func firstOfEachKey(recs []Record, outs []Outcome) []int {
	seen := make(map[string]struct{}, len(recs))
	firsts := make([]int, 0, len(recs))
	for i, r := range recs {
		if _, dup := seen[r.Key]; dup {
			outs[i] = Duplicate
			continue
		}
		seen[r.Key] = struct{}{}
		firsts = append(firsts, i)
	}
	return firsts
}

// ProcessBatch implements BatchStore: BEGIN; one INSERT … SELECT FROM
// unnest(…) ON CONFLICT DO NOTHING RETURNING of every key, in key order so
// that concurrent batches sharing keys cannot deadlock (one round trip);
// fn with the new ones; COMMIT. There are no savepoints: a failed fn rolls
// back the whole batch (the consumer then runs its messages one by one).
// COMMIT failures are reported as Process reports them.
func (p *Postgres) ProcessBatch(ctx context.Context, recs []Record, fn func(ctx context.Context, fresh []int) error) (outs []Outcome, err error) {
	if p.err != nil {
		return nil, &StoreError{Op: "config", Err: p.err}
	}
	if recs, err = storedAll(recs); err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, &StoreError{Op: "begin", Err: err}
	}
	outs = make([]Outcome, len(recs))
	firsts := firstOfEachKey(recs, outs)
	// Insert in key order: every batch takes its keys' row locks in one
	// order, so two batches that share keys wait for each other instead of
	// deadlocking (unnest keeps array order, and the INSERT its input's).
	byKey := slices.Clone(firsts)
	slices.SortFunc(byKey, func(a, b int) int { return strings.Compare(recs[a].Key, recs[b].Key) })
	keys := make([]string, len(byKey))
	topics := make([]string, len(byKey))
	parts := make([]int32, len(byKey))
	offs := make([]int64, len(byKey))
	for j, i := range byKey {
		keys[j], topics[j], parts[j], offs[j] = recs[i].Key, recs[i].Topic, recs[i].Partition, recs[i].Offset
	}

	var tx pgx.Tx
	var inserted map[string]struct{}
	for retried := false; ; retried = true {
		if tx, err = p.db.Begin(ctx); err != nil {
			return nil, &StoreError{Op: "begin", Err: err}
		}
		inserted, err = p.insertBatch(ctx, tx, recs[0].Group, keys, topics, parts, offs)
		if err == nil {
			break
		}
		rollback(ctx, tx)
		if retried || !p.heal(ctx, err) {
			return nil, &StoreError{Op: "insert", Err: err}
		}
	}
	done := false
	defer func() {
		if !done {
			rollback(ctx, tx)
		}
	}()
	fresh := make([]int, 0, len(inserted))
	for _, i := range firsts {
		if _, ok := inserted[recs[i].Key]; ok {
			fresh = append(fresh, i)
			outs[i] = Processed
		} else {
			outs[i] = Duplicate
		}
	}
	if len(fresh) == 0 {
		return outs, nil // deferred rollback: nothing was inserted
	}
	if err := fn(WithTx(ctx, tx), fresh); err != nil {
		if tx.Conn().IsClosed() {
			return nil, &StoreError{Op: "handler", Err: err}
		}
		return nil, err
	}
	done = true
	if err := commit(ctx, tx, recs[0].Group, strconv.Itoa(len(fresh))+" keys from "+recs[fresh[0]].Key); err != nil {
		return nil, err
	}
	return outs, nil
}

// insertBatch inserts the keys (in key order, one statement) and returns
// those that were new: with ON CONFLICT on the plain table, or after their
// advisory locks on the key-lock path (see Postgres).
func (p *Postgres) insertBatch(ctx context.Context, tx pgx.Tx, group string, keys, topics []string, parts []int32, offs []int64) (map[string]struct{}, error) {
	const rows = ` SELECT $1, k, t, p, o%s FROM unnest($2::text[], $3::text[], $4::int[], $5::bigint[]) WITH ORDINALITY AS u(k, t, p, o, n)`
	var q string
	args := []any{group, keys, topics, parts, offs}
	b := &pgx.Batch{}
	if !p.locked.Load() {
		q = `INSERT INTO ` + p.table.quoted + ` (consumer_group, idempotency_key, topic, "partition", "offset")` +
			fmt.Sprintf(rows, "") + ` ORDER BY n` +
			` ON CONFLICT (consumer_group, idempotency_key) DO NOTHING RETURNING idempotency_key`
	} else {
		locks := make([]int64, len(keys))
		for i, k := range keys {
			locks[i] = keyLock(group, k)
		}
		queueKeyLocks(b, locks...)
		q = `INSERT INTO ` + p.table.quoted + ` (consumer_group, idempotency_key, topic, "partition", "offset", processed_at)` +
			fmt.Sprintf(rows, ", coalesce($6, now())") +
			` WHERE NOT EXISTS (SELECT 1 FROM ` + p.table.quoted + ` x WHERE x.consumer_group = $1 AND x.idempotency_key = u.k)` +
			` ORDER BY n ON CONFLICT DO NOTHING RETURNING idempotency_key`
		args = append(args, testTime(p.at))
	}
	inserted := make(map[string]struct{}, len(keys))
	b.Queue(q, args...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var k string
			if err := rows.Scan(&k); err != nil {
				return err
			}
			inserted[k] = struct{}{}
		}
		return rows.Err()
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	return inserted, nil
}

// ProcessBatch implements BatchStore: the keys are taken in sorted order (so
// concurrent batches cannot deadlock), fn runs with the new ones, and they
// are recorded only if fn returns nil.
func (m *Memory) ProcessBatch(ctx context.Context, recs []Record, fn func(ctx context.Context, fresh []int) error) ([]Outcome, error) {
	recs, err := storedAll(recs)
	if err != nil {
		return nil, err
	}
	outs := make([]Outcome, len(recs))
	firsts := firstOfEachKey(recs, outs)
	order := append([]int(nil), firsts...)
	sort.Slice(order, func(a, b int) bool { return recs[order[a]].Key < recs[order[b]].Key })
	held := make([]int, 0, len(order))
	ok := false
	defer func() {
		for _, i := range held {
			m.release(m.key(recs[i].Group, recs[i].Key), ok)
		}
	}()
	for _, i := range order {
		dup, err := m.acquire(ctx, m.key(recs[i].Group, recs[i].Key))
		if err != nil {
			return nil, err
		}
		if dup {
			outs[i] = Duplicate
			continue
		}
		held = append(held, i)
		outs[i] = Processed
	}
	fresh := make([]int, 0, len(held))
	for _, i := range firsts {
		if outs[i] == Processed {
			fresh = append(fresh, i)
		}
	}
	if len(fresh) == 0 {
		return outs, nil
	}
	if err := fn(ctx, fresh); err != nil {
		return nil, err
	}
	ok = true
	return outs, nil
}

package dedupe

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file is the partitioned inbox (WithPartitions): the table
// range-partitioned by processed_at, a partition a day or a week, the
// partitions made ahead of time, and the old ones dropped; its conversion
// from a plain table is in partition_convert.go. docs/partitioned-inbox.md gives the design and the
// argument; the comments here say what each step relies on.

// The partition widths WithPartitions accepts.
const (
	partitionDay  = 24 * time.Hour
	partitionWeek = 7 * partitionDay
)

// Timing of the partition maintenance.
const (
	// partitionsAhead is how many intervals past now the partitions reach
	// after each maintenance pass (Migrate, each sweep): rows of the next
	// two days (or weeks) always have a partition waiting.
	partitionsAhead = 2
	// maxMissedPartitions is the most partitions of one interval each that
	// maintenance makes to fill a gap (a table nobody maintained for a
	// while); a longer gap gets one partition of its own.
	maxMissedPartitions = 64
	// maintLockTimeout bounds every lock the maintenance waits for (the
	// table's, while transactions on it end), so that a long transaction
	// delays a maintenance pass rather than queueing every inbox insert
	// behind it. The pass is tried again at the next sweep.
	maintLockTimeout = "5s"
	// convertLockTimeout is the same bound for the conversion of a plain
	// table, which renames it and so must wait for every transaction using
	// it.
	convertLockTimeout = "30s"
	// maintLockNamespace is the high half of the advisory lock key that
	// serialises the maintenance of one table ("idip"); the low half is the
	// table's oid.
	maintLockNamespace int64 = 0x69646970
)

// Suffixes of the names the partitioned layout derives from the table's.
const (
	plainSuffix = "_plain"               // the converted plain table, now the oldest partition
	boundSuffix = "_before_partitioning" // its CHECK constraint (processed_at < the first partition's start)
)

// readCommitted is the first statement of every transaction on the key-lock
// path: the key's check must see what committed before the key's lock was
// granted, which only READ COMMITTED gives (a REPEATABLE READ snapshot would
// be taken before the wait, at the lock statement).
const readCommitted = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"

// lockKeysSQL takes the transaction-level advisory locks of the keys in $1,
// in the array's order (a function scan keeps it).
const lockKeysSQL = "SELECT count(pg_advisory_xact_lock(h)) FROM unnest($1::bigint[]) AS h"

// keyLock is the advisory lock key of (group, key): every store that writes
// the key on the key-lock path takes it first, in its transaction.
func keyLock(group, key string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem-inbox\x00"))
	h.Write([]byte(group))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int64(h.Sum64())
}

// queueKeyLocks queues in b the start of a key-lock transaction: READ
// COMMITTED, then the locks of keys in ascending order (every transaction
// takes them in one order, so two batches sharing keys, or keys whose locks
// collide, wait for each other instead of deadlocking).
func queueKeyLocks(b *pgx.Batch, keys ...int64) {
	slices.Sort(keys)
	b.Queue(readCommitted)
	b.Queue(lockKeysSQL, slices.Compact(keys))
}

// validPartitions checks a WithPartitions width.
func validPartitions(every time.Duration) error {
	if every == 0 || every == partitionDay || every == partitionWeek {
		return nil
	}
	return fmt.Errorf("%w: WithPartitions(%v): want 24h (a partition a day) or 168h (a partition a week)", ErrInvalidConfig, every)
}

// boundaryAfter is the first partition boundary strictly after t for
// partitions of width every: midnight UTC for days, Monday midnight UTC for
// weeks.
func boundaryAfter(t time.Time, every time.Duration) time.Time {
	t = t.UTC()
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	if every == partitionWeek {
		back := (int(day.Weekday()) + 6) % 7 // days since Monday
		return day.AddDate(0, 0, 7-back)
	}
	return day.AddDate(0, 0, 1)
}

// pgTime is t as a timestamptz literal for DDL, which takes no parameters.
// It is generated, never user input.
func pgTime(t time.Time) string {
	return "'" + t.UTC().Format("2006-01-02 15:04:05.999999Z07:00") + "'"
}

// isNoPartition reports an INSERT refused because no partition holds its
// processed_at: maintenance has not made it (yet).
func isNoPartition(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23514" && strings.Contains(pe.Message, "no partition")
}

// isNoArbiter reports an INSERT … ON CONFLICT (consumer_group,
// idempotency_key) refused because the table has no such unique index: it
// is partitioned.
func isNoArbiter(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42P10"
}

// relation is the table as the catalog has it.
type relation struct {
	oid    uint32
	schema string
	kind   string // "p" partitioned, "r" plain; "" when it does not exist
	now    time.Time
}

// lookup reads the table's oid, schema and kind, and the database's clock.
// It resolves the name with a query on the catalog, under the statement's
// snapshot, rather than with to_regclass, whose cache may still name a
// table another transaction renamed a moment ago.
func (t table) lookup(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (relation, error) {
	r := relation{schema: t.schema}
	err := q.QueryRow(ctx, `SELECT coalesce((SELECT c.oid FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = $2), 0),
			coalesce(n.nspname, ''),
			coalesce((SELECT c.relkind::text FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = $2), ''),
			now()
		FROM (SELECT 1) one LEFT JOIN LATERAL (
			SELECT n.oid, n.nspname FROM unnest(CASE WHEN $1 = '' THEN current_schemas(true) ELSE ARRAY[$1]::name[] END)
			  WITH ORDINALITY AS s(nsp, ord)
			JOIN pg_namespace n ON n.nspname = s.nsp
			WHERE $1 <> '' OR EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = $2)
			ORDER BY s.ord LIMIT 1) n ON true`, t.schema, t.rel).Scan(&r.oid, &r.schema, &r.kind, &r.now)
	if err != nil {
		return relation{}, fmt.Errorf("dedupe: read the catalog entry of %s: %w", t.quoted, err)
	}
	return r, nil
}

// partition is one partition of the table.
type partition struct {
	name    string
	lo, hi  *time.Time // lo nil: MINVALUE (the converted plain table)
	pending bool       // a DETACH … CONCURRENTLY did not finish
	rows    float64    // pg_class.reltuples: PostgreSQL's estimate, -1 before the first ANALYZE
}

// partitionsSQL lists the partitions of the table whose oid is $1 with their
// bounds, read back from the bound expression in this session's time zone.
const partitionsSQL = `SELECT c.relname, i.inhdetachpending, c.reltuples::float8,
       (regexp_match(b.expr, 'FROM \(''([^'']*)''\)'))[1]::timestamptz,
       (regexp_match(b.expr, 'TO \(''([^'']*)''\)'))[1]::timestamptz
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid,
     LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS expr) b
WHERE i.inhparent = $1
ORDER BY 5`

func listPartitions(ctx context.Context, tx pgx.Tx, oid uint32) ([]partition, error) {
	rows, err := tx.Query(ctx, partitionsSQL, oid)
	if err != nil {
		return nil, fmt.Errorf("dedupe: list partitions: %w", err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partition, error) {
		var p partition
		err := r.Scan(&p.name, &p.pending, &p.rows, &p.lo, &p.hi)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("dedupe: list partitions: %w", err)
	}
	return ps, nil
}

// maint is one maintenance transaction on the table: it holds the table's
// maintenance lock and knows the table and its partitions.
type maint struct {
	tx    pgx.Tx
	t     table
	rel   relation
	parts []partition
}

// maintain runs fn in a transaction that holds the table's maintenance lock
// (serialising every maintainer of the table: members' sweepers, Migrate,
// a store filling a missing partition) with lockTimeout on every lock it
// waits for, and commits when fn returns nil. A table that does not exist
// is an error.
func (t table) maintain(ctx context.Context, db DB, lockTimeout string, fn func(m *maint) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("dedupe: maintain %s: begin: %w", t.quoted, err)
	}
	defer rollback(ctx, tx)
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
		return fmt.Errorf("dedupe: maintain %s: %w", t.quoted, err)
	}
	m := &maint{tx: tx, t: t}
	if m.rel, err = t.lookup(ctx, tx); err != nil {
		return err
	}
	if m.rel.kind == "" {
		return fmt.Errorf("dedupe: maintain %s: no such table (run Migrate or `idem migrate`)", t.quoted)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", maintLockNamespace<<32|int64(m.rel.oid)); err != nil {
		return fmt.Errorf("dedupe: maintain %s: take the maintenance lock: %w", t.quoted, err)
	}
	if m.rel, err = t.lookup(ctx, tx); err != nil { // another maintainer may have changed it meanwhile
		return err
	}
	if m.rel.kind == "p" {
		if m.parts, err = listPartitions(ctx, tx, m.rel.oid); err != nil {
			return err
		}
	}
	if err := fn(m); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("dedupe: maintain %s: commit: %w", t.quoted, err)
	}
	return nil
}

// qualified quotes name in the table's schema.
func (m *maint) qualified(name string) string {
	return pgx.Identifier{m.rel.schema, name}.Sanitize()
}

// width is the partition width to make: every when configured, else the
// width of the newest regular partition, else a day.
func (m *maint) width(every time.Duration) time.Duration {
	if every > 0 {
		return every
	}
	for i := len(m.parts) - 1; i >= 0; i-- {
		p := m.parts[i]
		if p.lo != nil && p.hi != nil {
			if w := p.hi.Sub(*p.lo); w == partitionDay || w == partitionWeek {
				return w
			}
		}
	}
	return partitionDay
}

// ensure makes the partitions the table lacks from its newest partition's
// end until partitionsAhead intervals past now (the database's clock): each
// the interval up to the next aligned boundary, so partitions never overlap
// and leave no gap, whatever width made the older ones. A gap of more than
// maxMissedPartitions intervals up to the current one gets one partition. It
// returns the names made.
func (m *maint) ensure(ctx context.Context, every time.Duration) ([]string, error) {
	if m.rel.kind != "p" {
		return nil, nil
	}
	every = m.width(every)
	current := boundaryAfter(m.rel.now, every).Add(-every) // the start of the current interval
	var from time.Time
	for _, p := range m.parts {
		if p.hi != nil && p.hi.After(from) {
			from = *p.hi
		}
	}
	if from.IsZero() { // no partition yet
		from = current
	}
	until := m.rel.now.Add(partitionsAhead * every)
	var made []string
	for from.Before(until) {
		to := boundaryAfter(from, every)
		if current.Sub(from) > maxMissedPartitions*every {
			to = current
		}
		name := derivedName(m.t.rel, "_p"+from.UTC().Format("20060102"), 58)
		if err := m.attach(ctx, name, pgTime(from), pgTime(to)); err != nil {
			return made, err
		}
		lo, hi := from, to
		m.parts = append(m.parts, partition{name: name, lo: &lo, hi: &hi})
		made = append(made, name)
		from = to
	}
	return made, nil
}

// attach makes partition name for [lo, hi) without blocking the table's
// inserts: an empty table like the parent, with the key's primary key, then
// ATTACH PARTITION, which takes only a SHARE UPDATE EXCLUSIVE lock on the
// parent and has nothing to check in an empty table.
func (m *maint) attach(ctx context.Context, name, lo, hi string) error {
	q := m.qualified(name)
	pk := pgx.Identifier{name + "_pkey"}.Sanitize()
	if _, err := m.tx.Exec(ctx, `CREATE TABLE `+q+` (LIKE `+m.t.quoted+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
		CONSTRAINT `+pk+` PRIMARY KEY (consumer_group, idempotency_key))`); err != nil {
		return fmt.Errorf("dedupe: create partition %s: %w", q, err)
	}
	if _, err := m.tx.Exec(ctx, `ALTER TABLE `+m.t.quoted+` ATTACH PARTITION `+q+` FOR VALUES FROM (`+lo+`) TO (`+hi+`)`); err != nil {
		return fmt.Errorf("dedupe: attach partition %s: %w", q, err)
	}
	return nil
}

// ensurePartitions makes the partitions the table lacks (see maint.ensure),
// in one maintenance transaction. A plain table is left alone.
func (t table) ensurePartitions(ctx context.Context, db DB) ([]string, error) {
	var made []string
	err := t.maintain(ctx, db, maintLockTimeout, func(m *maint) (err error) {
		made, err = m.ensure(ctx, t.every)
		return err
	})
	return made, err
}

// dropExpired drops every partition whose end is at or before horizon
// (before now() − retention by the database's clock), first detaching it
// with DETACH PARTITION … CONCURRENTLY, which waits for the transactions
// that use the table without blocking them, then dropping the detached
// table, which nothing uses any more. It returns the names dropped and
// their rows as PostgreSQL estimates them (pg_class.reltuples). A detach an
// earlier call began and did not finish is finished first.
func (t table) dropExpired(ctx context.Context, db DB, retention time.Duration) (dropped []string, rows int64, err error) {
	var old []partition
	var schema string
	err = t.maintain(ctx, db, maintLockTimeout, func(m *maint) error {
		schema = m.rel.schema
		horizon := m.rel.now.Add(-retention)
		for _, p := range m.parts {
			if p.pending || (p.hi != nil && !p.hi.After(horizon)) {
				old = append(old, p)
			}
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	for _, p := range old {
		q := pgx.Identifier{schema, p.name}.Sanitize()
		detach := `ALTER TABLE ` + t.quoted + ` DETACH PARTITION ` + q + ` CONCURRENTLY`
		if p.pending {
			detach = `ALTER TABLE ` + t.quoted + ` DETACH PARTITION ` + q + ` FINALIZE`
		}
		if _, err := db.Exec(ctx, detach); err != nil {
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "25001" { // 25001: inside a transaction block (db is a pgx.Tx)
				return dropped, rows, fmt.Errorf("dedupe: detach partition %s: %w", q, err)
			}
			// No concurrent detach inside a transaction: DROP does both,
			// with a brief lock on the table.
		}
		if _, err := db.Exec(ctx, `DROP TABLE `+q); err != nil {
			return dropped, rows, fmt.Errorf("dedupe: drop partition %s: %w", q, err)
		}
		dropped = append(dropped, p.name)
		rows += int64(max(p.rows, 0))
	}
	return dropped, rows, nil
}

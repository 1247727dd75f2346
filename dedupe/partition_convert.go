package dedupe

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is the conversion of a plain inbox table to the partitioned
// layout (WithPartitions), step by step, each step resumable; partition.go
// holds the layout it converts to and its maintenance.

// partition converts the table, once migrated plain, to the partitioned
// layout, moving no row, and makes the partitions ahead. at, when not zero,
// stands for the database's clock when the first partition's start is
// chosen (tests: a conversion in the past). Steps, each its own transaction
// under the maintenance lock, so a crash between them leaves a state the
// next call resumes from:
//
//  1. add CHECK (processed_at < B) NOT VALID, B the first aligned boundary
//     at least one interval away: instant, and from then on every new row
//     of the plain table is older than B. A constraint left by an earlier
//     call that did not finish, whose B is less than half an interval away,
//     is made again with a new B;
//  2. VALIDATE it: one scan of the table, under a SHARE UPDATE EXCLUSIVE
//     lock, which does not block inserts, updates or deletes;
//  3. rename the table to <table>_plain, create the partitioned table
//     <table> like it, and attach <table>_plain as its partition [MINVALUE,
//     B): the validated constraint proves its bound, so the attach reads no
//     row. Then the partitions from B on. This is the only step that locks
//     the table against writes, for a few catalog updates.
func (t table) partition(ctx context.Context, db DB, at time.Time) error {
	if err := serverAtLeast14(ctx, db); err != nil {
		return err
	}
	boundName := derivedName(t.rel, boundSuffix, 63)
	bound := pgx.Identifier{boundName}.Sanitize()
	done := false
	err := t.maintain(ctx, db, maintLockTimeout, func(m *maint) error {
		if m.rel.kind == "p" {
			done = true
			return nil
		}
		now := m.rel.now
		if !at.IsZero() {
			now = at
		}
		b, _, err := m.boundOf(ctx, boundName)
		if err != nil {
			return err
		}
		if b != nil && b.Sub(now) >= t.every/2 {
			return nil // an earlier call's constraint, still far enough away
		}
		if b != nil {
			if _, err := m.tx.Exec(ctx, `ALTER TABLE `+t.quoted+` DROP CONSTRAINT `+bound); err != nil {
				return fmt.Errorf("dedupe: partition %s: drop stale constraint: %w", t.quoted, err)
			}
		}
		first := boundaryAfter(now.Add(t.every), t.every)
		_, err = m.tx.Exec(ctx, `ALTER TABLE `+t.quoted+` ADD CONSTRAINT `+bound+` CHECK (processed_at < `+pgTime(first)+`) NOT VALID`)
		if err != nil {
			return fmt.Errorf("dedupe: partition %s: add constraint: %w", t.quoted, err)
		}
		return nil
	})
	if err != nil || done {
		if err == nil {
			_, err = t.ensurePartitions(ctx, db)
		}
		return err
	}
	err = t.maintain(ctx, db, convertLockTimeout, func(m *maint) error {
		if m.rel.kind == "p" {
			return nil
		}
		if _, err := m.tx.Exec(ctx, `ALTER TABLE `+t.quoted+` VALIDATE CONSTRAINT `+bound); err != nil {
			return fmt.Errorf("dedupe: partition %s: validate constraint: %w", t.quoted, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return t.maintain(ctx, db, convertLockTimeout, func(m *maint) error {
		if m.rel.kind == "p" {
			_, err := m.ensure(ctx, t.every)
			return err
		}
		b, valid, err := m.boundOf(ctx, boundName)
		if err != nil {
			return err
		}
		if b == nil || !valid {
			return fmt.Errorf("dedupe: partition %s: constraint %s missing or not validated; run Migrate again", t.quoted, bound)
		}
		plain := derivedName(t.rel, plainSuffix, 58)
		for _, q := range []string{
			`ALTER TABLE ` + t.quoted + ` RENAME TO ` + pgx.Identifier{plain}.Sanitize(),
			`CREATE TABLE ` + t.quoted + ` (LIKE ` + m.qualified(plain) + ` INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (processed_at)`,
			`ALTER TABLE ` + t.quoted + ` DROP CONSTRAINT ` + bound,
			`ALTER TABLE ` + t.quoted + ` ATTACH PARTITION ` + m.qualified(plain) + ` FOR VALUES FROM (MINVALUE) TO (` + pgTime(*b) + `)`,
		} {
			if _, err := m.tx.Exec(ctx, q); err != nil {
				return fmt.Errorf("dedupe: partition %s: %w", t.quoted, err)
			}
		}
		if m.rel, err = t.lookup(ctx, m.tx); err != nil {
			return err
		}
		hi := *b
		m.parts = []partition{{name: plain, hi: &hi}}
		_, err = m.ensure(ctx, t.every)
		return err
	})
}

// boundOf reads the bound B of the table's constraint name (CHECK
// (processed_at < B)) and whether it is validated; nil when there is none.
func (m *maint) boundOf(ctx context.Context, name string) (*time.Time, bool, error) {
	var b *time.Time
	var valid bool
	err := m.tx.QueryRow(ctx, `SELECT (regexp_match(pg_get_constraintdef(oid), '''([^'']+)'''))[1]::timestamptz, convalidated
		FROM pg_constraint WHERE conrelid = $1 AND conname = $2`, m.rel.oid, name).Scan(&b, &valid)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("dedupe: partition %s: read constraint %s: %w", m.t.quoted, name, err)
	}
	return b, valid, nil
}

// serverAtLeast14 refuses servers older than PostgreSQL 14, which lack
// DETACH PARTITION … CONCURRENTLY.
func serverAtLeast14(ctx context.Context, db DB) error {
	var v int
	if err := db.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&v); err != nil {
		return fmt.Errorf("dedupe: read the server's version: %w", err)
	}
	if v < 140000 {
		return fmt.Errorf("%w: WithPartitions needs PostgreSQL 14 or later (DETACH PARTITION … CONCURRENTLY); this server is %d", ErrInvalidConfig, v)
	}
	return nil
}

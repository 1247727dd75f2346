package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// key is the i-th key: 32 hex digits, the size of a UUID without dashes,
// and spread over the whole key space as random keys are.
const keySQL = "md5(i::text)"

// load fills l's table with rows i in [0, rows): key md5(i), processed_at
// spread evenly over [first, midnight). The plain table loses its indexes
// while loading and gets them back, with their names, afterwards; the
// partitioned one gets daily partitions for the span, each loaded before
// its primary key is built and then attached, in place of the empty
// oldest partition that Migrate made.
func load(ctx context.Context, pool *pgxpool.Pool, o options, schema string, l *layout, first, midnight time.Time) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SET maintenance_work_mem = '"+o.maintenanceMem+"'"); err != nil {
		return err
	}
	span := midnight.Sub(first).Seconds()
	q := pgx.Identifier{schema, l.rel}.Sanitize()
	insert := func(into string, from, to int64) error {
		for lo := from; lo < to; lo += o.chunk {
			hi := min(lo+o.chunk, to)
			_, err := conn.Exec(ctx, `INSERT INTO `+into+` (consumer_group, idempotency_key, topic, "partition", "offset", processed_at)
				SELECT $1, `+keySQL+`, 'payments', (i % 12)::int, i, $2::timestamptz + (i::float8 * $3 / $4) * interval '1 second'
				FROM generate_series($5::bigint, $6::bigint - 1) i`, group, first, span, float64(o.rows), lo, hi)
			if err != nil {
				return err
			}
			fmt.Printf("  %s: %d/%d rows\n", l.name, hi, o.rows)
		}
		return nil
	}
	if l.name == "plain" {
		for _, s := range []string{
			"ALTER TABLE " + q + " SET (autovacuum_enabled = false)",
			"ALTER TABLE " + q + " DROP CONSTRAINT " + pgx.Identifier{l.rel + "_pkey"}.Sanitize(),
			"DROP INDEX " + pgx.Identifier{schema, l.rel + "_processed_at_idx"}.Sanitize(),
		} {
			if _, err := conn.Exec(ctx, s); err != nil {
				return err
			}
		}
		if err := insert(q, 0, o.rows); err != nil {
			return err
		}
		for _, s := range []string{
			"ALTER TABLE " + q + " ADD CONSTRAINT " + pgx.Identifier{l.rel + "_pkey"}.Sanitize() + " PRIMARY KEY (consumer_group, idempotency_key)",
			"CREATE INDEX " + pgx.Identifier{l.rel + "_processed_at_idx"}.Sanitize() + " ON " + q + " (processed_at)",
			"VACUUM ANALYZE " + q,
		} {
			if _, err := conn.Exec(ctx, s); err != nil {
				return err
			}
		}
		return nil
	}
	// Partitioned: the oldest partition Migrate made ends after today;
	// replace it by partitions of the table's width from the one holding
	// first to its end.
	var plainEnd time.Time
	if err := conn.QueryRow(ctx, `SELECT (regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']*)''\)'))[1]::timestamptz
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		schema, l.rel+"_plain").Scan(&plainEnd); err != nil {
		return fmt.Errorf("read the oldest partition's end: %w", err)
	}
	old := pgx.Identifier{schema, l.rel + "_plain"}.Sanitize()
	if _, err := conn.Exec(ctx, "ALTER TABLE "+q+" DETACH PARTITION "+old); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "DROP TABLE "+old); err != nil {
		return err
	}
	start := first
	if l.every == week {
		start = weekAfter(first).AddDate(0, 0, -7)
	}
	spanSecs := int64(midnight.Sub(first) / time.Second)
	for d := start; d.Before(plainEnd); d = d.Add(l.every) {
		name := l.rel + "_p" + d.Format("20060102")
		p := pgx.Identifier{schema, name}.Sanitize()
		if _, err := conn.Exec(ctx, "CREATE TABLE "+p+" (LIKE "+q+" INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (autovacuum_enabled = false)"); err != nil {
			return err
		}
		// The rows whose time falls in [d, d + every): row j's time is
		// first + j·span/rows.
		lo := min(max(int64(d.Sub(first)/time.Second), 0), spanSecs)
		hi := min(max(int64(d.Add(l.every).Sub(first)/time.Second), 0), spanSecs)
		if from, to := ceilDiv(lo*o.rows, spanSecs), ceilDiv(hi*o.rows, spanSecs); from < to {
			if err := insert(p, from, to); err != nil {
				return err
			}
		}
		for _, s := range []string{
			"ALTER TABLE " + p + " ADD CONSTRAINT " + pgx.Identifier{name + "_pkey"}.Sanitize() + " PRIMARY KEY (consumer_group, idempotency_key)",
			"ALTER TABLE " + q + " ATTACH PARTITION " + p + " FOR VALUES FROM ('" + d.Format(time.RFC3339) + "') TO ('" + d.Add(l.every).Format(time.RFC3339) + "')",
			"VACUUM ANALYZE " + p,
		} {
			if _, err := conn.Exec(ctx, s); err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
		}
	}
	// The partitions Migrate made ahead, too, without autovacuum.
	rows, err := conn.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass`, q)
	if err != nil {
		return err
	}
	parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := conn.Exec(ctx, "ALTER TABLE "+pgx.Identifier{schema, p}.Sanitize()+" SET (autovacuum_enabled = false)"); err != nil {
			return err
		}
	}
	return nil
}

// weekAfter is the first Monday midnight UTC after t.
func weekAfter(t time.Time) time.Time {
	t = t.UTC()
	d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, 7-(int(d.Weekday())+6)%7)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

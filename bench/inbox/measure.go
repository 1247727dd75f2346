package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
)

// sizes records the table's size and partitions.
func sizes(ctx context.Context, pool *pgxpool.Pool, schema string, l *layout, r *result, rows int64) error {
	q := pgx.Identifier{schema, l.rel}.Sanitize()
	err := pool.QueryRow(ctx, `WITH t AS (
		  SELECT c.oid FROM pg_class c WHERE c.oid = $1::regclass AND c.relkind = 'r'
		  UNION ALL SELECT i.inhrelid FROM pg_inherits i WHERE i.inhparent = $1::regclass)
		SELECT count(*) FILTER (WHERE oid <> $1::regclass), sum(pg_total_relation_size(oid))::bigint,
		       sum(pg_relation_size(oid))::bigint, sum(pg_indexes_size(oid))::bigint FROM t`, q).
		Scan(&r.Partitions, &r.TotalBytes, &r.HeapBytes, &r.IndexBytes)
	if err != nil {
		return fmt.Errorf("%s: sizes: %w", l.name, err)
	}
	r.BytesPerRow = float64(r.TotalBytes) / float64(rows)
	return nil
}

// lookups processes n existing keys (Duplicates), rows [lo, hi), one
// after the other and returns each call's latency.
func lookups(ctx context.Context, l *layout, n int, lo, hi int64, seed uint64) ([]time.Duration, error) {
	rnd := rand.New(rand.NewPCG(seed, 0x1b))
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint(lo + rnd.Int64N(hi-lo))
	}
	hashed, err := md5s(ctx, l, keys)
	if err != nil {
		return nil, err
	}
	out := make([]time.Duration, 0, n)
	for _, k := range hashed {
		start := time.Now()
		res, err := l.store.Process(ctx, dedupe.Record{Group: group, Key: k, Topic: "payments"}, func(context.Context) error { return nil })
		if err != nil {
			return nil, err
		}
		if res != dedupe.Duplicate {
			return nil, fmt.Errorf("key %s (an existing one) came back %v", k, res)
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// md5s turns the keys' numbers into the keys load wrote.
func md5s(ctx context.Context, l *layout, nums []string) ([]string, error) {
	var out []string
	err := l.store.DB().QueryRow(ctx, "SELECT array_agg(md5(n) ORDER BY o) FROM unnest($1::text[]) WITH ORDINALITY AS u(n, o)", nums).Scan(&out)
	return out, err
}

// buffers is the shared buffers one key's check reads (EXPLAIN ANALYZE,
// BUFFERS of the check the store runs), for an existing key.
func buffers(ctx context.Context, pool *pgxpool.Pool, l *layout) (int64, error) {
	var plan []map[string]any
	q := `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT 1 FROM ` + l.table + ` WHERE consumer_group = $1 AND idempotency_key = md5('12345')`
	if err := pool.QueryRow(ctx, q, group).Scan(&plan); err != nil {
		return 0, fmt.Errorf("%s: explain: %w", l.name, err)
	}
	p, _ := plan[0]["Plan"].(map[string]any)
	hit, _ := p["Shared Hit Blocks"].(float64)
	read, _ := p["Shared Read Blocks"].(float64)
	return int64(hit + read), nil
}

// inserts processes n new keys with workers, batch keys a call, and returns
// each call's latency and the elapsed time.
func inserts(ctx context.Context, l *layout, n, workers, batch int, next *atomic.Int64) ([]time.Duration, time.Duration, error) {
	var mu sync.Mutex
	var out []time.Duration
	var first error
	var wg sync.WaitGroup
	calls := (n + batch - 1) / batch
	var done atomic.Int64
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for done.Add(1) <= int64(calls) {
				recs := make([]dedupe.Record, batch)
				for i := range recs {
					recs[i] = dedupe.Record{Group: group, Key: fmt.Sprintf("new-%d", next.Add(1)), Topic: "payments"}
				}
				t := time.Now()
				var err error
				if batch == 1 {
					_, err = l.store.Process(ctx, recs[0], func(context.Context) error { return nil })
				} else {
					_, err = l.store.ProcessBatch(ctx, recs, func(context.Context, []int) error { return nil })
				}
				d := time.Since(t)
				mu.Lock()
				out = append(out, d)
				if err != nil && first == nil {
					first = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	return out, time.Since(start), first
}

// sweep runs the Sweeper once with the retention that puts its horizon at
// horizon and measures it, then, for the plain table, the VACUUM its
// deletes call for.
func sweep(ctx context.Context, pool *pgxpool.Pool, schema string, l *layout, r *result, horizon time.Time) error {
	dead := func() (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables
			WHERE schemaname = $1 AND relname LIKE $2 || '%'`, schema, l.rel).Scan(&n)
		return n, err
	}
	deadBefore, err := dead()
	if err != nil {
		return err
	}
	var retention time.Duration
	if err := pool.QueryRow(ctx, "SELECT (extract(epoch FROM now() - $1::timestamptz) * 1e6)::bigint", horizon).Scan(&retention); err != nil {
		return err
	}
	retention *= time.Microsecond
	lsn := func() (string, error) {
		var s string
		err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s)
		return s, err
	}
	walSince := func(from string) (int64, error) {
		var n int64
		err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", from).Scan(&n)
		return n, err
	}
	before, err := lsn()
	if err != nil {
		return err
	}
	sw := &dedupe.Sweeper{DB: pool, Table: l.table, Retention: retention}
	start := time.Now()
	n, err := sw.SweepOnce(ctx)
	if err != nil {
		return err
	}
	r.SweepSeconds, r.SweepRows = time.Since(start).Seconds(), n
	if r.SweepWALBytes, err = walSince(before); err != nil {
		return err
	}
	// Dead tuples reach pg_stat_user_tables when the sweeping sessions
	// flush their statistics (PostgreSQL 15: within about ten seconds).
	deadline := time.Now().Add(30 * time.Second)
	for {
		d, err := dead()
		if err != nil {
			return err
		}
		r.DeadTuples = d - deadBefore
		if l.name != "plain" || float64(r.DeadTuples) >= 0.99*float64(n) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond) // a program, not a test: waiting for the statistics to be flushed
	}
	if l.name == "plain" {
		before, err := lsn()
		if err != nil {
			return err
		}
		start := time.Now()
		if _, err := pool.Exec(ctx, "VACUUM "+pgx.Identifier{schema, l.rel}.Sanitize()); err != nil {
			return err
		}
		r.VacuumSeconds = time.Since(start).Seconds()
		if r.VacuumWALBytes, err = walSince(before); err != nil {
			return err
		}
	}
	fmt.Printf("%s: swept %d rows in %.1fs, %s of WAL, %d dead tuples\n", l.name, n, r.SweepSeconds, bytes(r.SweepWALBytes), r.DeadTuples)
	return nil
}

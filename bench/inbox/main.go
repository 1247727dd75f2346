// Command idem-bench-inbox measures the inbox at scale, plain beside
// partitioned (dedupe.WithPartitions), in one run on the PostgreSQL of
// DATABASE_URL (`make bench-inbox` reads it from .state/services.env):
//
//   - sweep cost: the Sweeper deleting the oldest day of rows (plain)
//     against dropping the oldest day's partition (partitioned), in time,
//     WAL bytes (pg_current_wal_lsn before and after) and dead tuples
//     (pg_stat_user_tables), and for the plain table the VACUUM the delete
//     calls for;
//   - insert throughput: new keys through dedupe.Postgres.Process and
//     ProcessBatch, several workers, the layouts alternating in blocks;
//   - dedupe lookups: Process of an existing key (a Duplicate), p50/p99,
//     alternating in blocks, and the buffers one key's check reads;
//   - size: bytes per row, table and indexes.
//
// The rows (-rows, default 50,000,000) are made with INSERT … SELECT
// generate_series, the same keys and times in both tables, spread evenly
// over the -days days before today's midnight (UTC): the oldest day is
// exactly one partition. Everything lives in a schema of its own, dropped at
// the end (-keep keeps it).
//
//	make bench-inbox                               # 50 M rows: an hour or more, ~25 GB of disk
//	make bench-inbox INBOXARGS='-rows 1000000'     # a quick pass
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
)

type options struct {
	rows           int64
	days           int
	lookups        int
	inserts        int
	workers        int
	batch          int
	blocks         int
	keep           bool
	out            string
	chunk          int64
	maintenanceMem string
}

const group = "bench"

func main() {
	var o options
	flag.Int64Var(&o.rows, "rows", 50_000_000, "rows in each table")
	flag.IntVar(&o.days, "days", 15, "days the rows span, ending at today's midnight UTC (the sweep keeps days-1)")
	flag.IntVar(&o.lookups, "lookups", 20_000, "duplicate lookups per layout")
	flag.IntVar(&o.inserts, "inserts", 40_000, "new keys per layout and mode (per message, batches)")
	flag.IntVar(&o.workers, "workers", 8, "concurrent workers of the insert load")
	flag.IntVar(&o.batch, "batch", 100, "keys per ProcessBatch")
	flag.IntVar(&o.blocks, "blocks", 10, "blocks the lookups and inserts alternate the layouts in")
	flag.BoolVar(&o.keep, "keep", false, "keep the schema (and its tables) at the end")
	flag.StringVar(&o.out, "out", "bench/out", "directory of the JSON report")
	flag.Int64Var(&o.chunk, "chunk", 5_000_000, "rows per INSERT … SELECT while loading")
	flag.StringVar(&o.maintenanceMem, "maintenance-work-mem", "1GB", "maintenance_work_mem of the loading session (index builds)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench-inbox:", err)
		os.Exit(1)
	}
}

// layout is one of the tables under test.
type layout struct {
	name  string        // "plain", "daily", "weekly"
	every time.Duration // partition width; 0: plain
	table string        // schema-qualified, for dedupe.WithTable
	rel   string
	store *dedupe.Postgres
}

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// report is the JSON the run writes.
type report struct {
	Start, End       time.Time
	Rows             int64
	Days             int
	LoadAvg          [2]string
	Server           string
	Layouts          map[string]*result
	LoadSeconds      map[string]float64
	LookupsPerLayout int
	InsertsPerLayout int
	Workers, Batch   int
}

type result struct {
	Partitions       int
	TotalBytes       int64
	HeapBytes        int64
	IndexBytes       int64
	BytesPerRow      float64
	SweepSeconds     float64
	SweepRows        int64
	SweepWALBytes    int64
	DeadTuples       int64
	VacuumSeconds    float64
	VacuumWALBytes   int64
	LookupP50Micros  float64
	LookupP99Micros  float64
	LookupBuffers    int64 // shared buffers read or hit by one key's check (EXPLAIN)
	InsertPerSec     float64
	InsertP99Micros  float64
	BatchKeysPerSec  float64
	BatchP99Micros   float64
	PostSweepLookups float64 // p99 µs after the sweep
}

func run(ctx context.Context, o options) error {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is not set (make services; set -a; . .state/services.env; set +a)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.MaxConns = int32(max(o.workers, 4) + 2)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	schema := fmt.Sprintf("inboxbench_%d", os.Getpid())
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	if !o.keep {
		defer func() {
			fmt.Println("dropping schema", schema)
			if _, err := pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
				fmt.Fprintln(os.Stderr, "idem-bench-inbox: drop schema:", err)
			}
		}()
	}
	rep := &report{Start: time.Now().UTC(), Rows: o.rows, Days: o.days, Layouts: map[string]*result{},
		LoadSeconds: map[string]float64{}, LookupsPerLayout: o.lookups, InsertsPerLayout: o.inserts, Workers: o.workers, Batch: o.batch}
	rep.LoadAvg[0] = loadAvg()
	_ = pool.QueryRow(ctx, "SELECT version()").Scan(&rep.Server)

	var midnight time.Time
	if err := pool.QueryRow(ctx, "SELECT date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'").Scan(&midnight); err != nil {
		return err
	}
	first := midnight.AddDate(0, 0, -o.days)
	layouts := []*layout{
		{name: "plain", rel: "plain_inbox"},
		{name: "daily", rel: "daily_inbox", every: day},
		{name: "weekly", rel: "weekly_inbox", every: week},
	}
	for _, l := range layouts {
		l.table = schema + "." + l.rel
		opts := []dedupe.PostgresOption{dedupe.WithTable(l.table)}
		if l.every > 0 {
			opts = append(opts, dedupe.WithPartitions(l.every))
		}
		l.store = dedupe.NewPostgres(pool, opts...)
		if err := l.store.Migrate(ctx); err != nil {
			return fmt.Errorf("%s: migrate: %w", l.name, err)
		}
		rep.Layouts[l.name] = &result{}
		start := time.Now()
		if err := load(ctx, pool, o, schema, l, first, midnight); err != nil {
			return fmt.Errorf("%s: load: %w", l.name, err)
		}
		rep.LoadSeconds[l.name] = time.Since(start).Seconds()
		fmt.Printf("%s: loaded %d rows in %s\n", l.name, o.rows, time.Since(start).Round(time.Second))
	}
	for _, l := range layouts {
		if err := sizes(ctx, pool, schema, l, rep.Layouts[l.name], o.rows); err != nil {
			return err
		}
	}

	// Lookups of existing keys, then inserts of new ones, the layouts
	// alternating block by block so that a change of the machine's load
	// falls on both.
	lat := map[string][]time.Duration{}
	for b := range o.blocks {
		for _, l := range rotate(layouts, b) {
			d, err := lookups(ctx, l, o.lookups/o.blocks, 0, o.rows, uint64(b))
			if err != nil {
				return fmt.Errorf("%s: lookups: %w", l.name, err)
			}
			lat[l.name] = append(lat[l.name], d...)
		}
	}
	for _, l := range layouts {
		r := rep.Layouts[l.name]
		r.LookupP50Micros, r.LookupP99Micros = pct(lat[l.name], 50), pct(lat[l.name], 99)
		if r.LookupBuffers, err = buffers(ctx, pool, l); err != nil {
			return err
		}
	}
	ins := map[string][]time.Duration{}
	bat := map[string][]time.Duration{}
	took := map[string]time.Duration{}
	btook := map[string]time.Duration{}
	var next atomic.Int64
	next.Store(o.rows)
	for b := range o.blocks {
		for _, l := range rotate(layouts, b) {
			d, el, err := inserts(ctx, l, o.inserts/o.blocks, o.workers, 1, &next)
			if err != nil {
				return fmt.Errorf("%s: inserts: %w", l.name, err)
			}
			ins[l.name], took[l.name] = append(ins[l.name], d...), took[l.name]+el
			d, el, err = inserts(ctx, l, o.inserts/o.blocks, max(o.workers/2, 1), o.batch, &next)
			if err != nil {
				return fmt.Errorf("%s: batches: %w", l.name, err)
			}
			bat[l.name], btook[l.name] = append(bat[l.name], d...), btook[l.name]+el
		}
	}
	for _, l := range layouts {
		r := rep.Layouts[l.name]
		per := o.inserts / o.blocks * o.blocks
		r.InsertPerSec = float64(per) / took[l.name].Seconds()
		r.InsertP99Micros = pct(ins[l.name], 99)
		r.BatchKeysPerSec = float64(per) / btook[l.name].Seconds()
		r.BatchP99Micros = pct(bat[l.name], 99)
	}

	// The sweep: the oldest day goes from the plain table and the daily
	// partitions, the horizon being that day's end exactly, so both remove
	// the same rows; the oldest week goes from the weekly partitions.
	for _, l := range layouts {
		horizon := first.AddDate(0, 0, 1)
		if l.every == week {
			horizon = weekAfter(first)
		}
		if err := sweep(ctx, pool, schema, l, rep.Layouts[l.name], horizon); err != nil {
			return fmt.Errorf("%s: sweep: %w", l.name, err)
		}
	}
	for _, l := range layouts {
		var kept int64 // the first row the sweep kept
		if l.every == week {
			kept = int64(weekAfter(first).Sub(first) / time.Second)
		} else {
			kept = int64(day / time.Second)
		}
		kept = ceilDiv(kept*o.rows, int64(o.days)*int64(day/time.Second))
		d, err := lookups(ctx, l, o.lookups/o.blocks, kept, o.rows, 99)
		if err != nil {
			return err
		}
		rep.Layouts[l.name].PostSweepLookups = pct(d, 99)
	}
	rep.End, rep.LoadAvg[1] = time.Now().UTC(), loadAvg()
	printTable(rep)
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	name := fmt.Sprintf("%s/inbox-%s.json", o.out, rep.Start.Format("2006-01-02T15-04"))
	js, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(name, js, 0o644); err != nil {
		return err
	}
	fmt.Println("wrote", name)
	return nil
}

// rotate starts the layouts at b's turn.
func rotate(ls []*layout, b int) []*layout {
	i := b % len(ls)
	return append(slices.Clone(ls[i:]), ls[:i]...)
}

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

// weekAfter is the first Monday midnight UTC after t.
func weekAfter(t time.Time) time.Time {
	t = t.UTC()
	d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, 7-(int(d.Weekday())+6)%7)
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func pct(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, int(float64(len(s))*p/100))
	return float64(s[i].Microseconds())
}

func bytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func printTable(rep *report) {
	ls := []string{"plain", "daily", "weekly"}
	fmt.Printf("\ninbox at %d rows over %d days; %s; load %s → %s\n\n", rep.Rows, rep.Days, rep.Start.Format("2006-01-02 15:04 UTC"), rep.LoadAvg[0], rep.LoadAvg[1])
	fmt.Println("| | plain (DELETE) | partitioned by day (DROP) | partitioned by week (DROP) |")
	fmt.Println("|---|---:|---:|---:|")
	row := func(what string, f func(r *result) string) {
		cells := make([]string, len(ls))
		for i, l := range ls {
			cells[i] = f(rep.Layouts[l])
		}
		fmt.Printf("| %s | %s |\n", what, strings.Join(cells, " | "))
	}
	row("partitions", func(r *result) string { return fmt.Sprint(r.Partitions) })
	row("size, table + indexes", func(r *result) string { return bytes(r.TotalBytes) })
	row("bytes per row", func(r *result) string { return fmt.Sprintf("%.0f", r.BytesPerRow) })
	row("sweep: rows removed (partitions: estimate)", func(r *result) string { return fmt.Sprint(r.SweepRows) })
	row("sweep: time", func(r *result) string { return fmt.Sprintf("%.2f s", r.SweepSeconds) })
	row("sweep: WAL", func(r *result) string { return bytes(r.SweepWALBytes) })
	row("sweep: dead tuples left", func(r *result) string { return fmt.Sprint(r.DeadTuples) })
	row("VACUUM after the sweep: time, WAL", func(r *result) string {
		if r.Partitions > 0 {
			return "none needed"
		}
		return fmt.Sprintf("%.1f s, %s", r.VacuumSeconds, bytes(r.VacuumWALBytes))
	})
	row("dedupe lookup (Process of a duplicate): p50 / p99", func(r *result) string {
		return fmt.Sprintf("%.0f / %.0f µs", r.LookupP50Micros, r.LookupP99Micros)
	})
	row("buffers one key's check reads", func(r *result) string { return fmt.Sprint(r.LookupBuffers) })
	row(fmt.Sprintf("insert, a key per transaction, %d workers: keys/s (p99)", rep.Workers), func(r *result) string {
		return fmt.Sprintf("%.0f (%.0f µs)", r.InsertPerSec, r.InsertP99Micros)
	})
	row(fmt.Sprintf("insert, batches of %d, %d workers: keys/s (p99 a batch)", rep.Batch, max(rep.Workers/2, 1)), func(r *result) string {
		return fmt.Sprintf("%.0f (%.0f µs)", r.BatchKeysPerSec, r.BatchP99Micros)
	})
	row("lookup p99 after the sweep", func(r *result) string { return fmt.Sprintf("%.0f µs", r.PostSweepLookups) })
	fmt.Printf("\nload: plain %.0f s, daily %.0f s, weekly %.0f s\n", rep.LoadSeconds["plain"], rep.LoadSeconds["daily"], rep.LoadSeconds["weekly"])
}

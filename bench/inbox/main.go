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
	"os"
	"os/signal"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

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

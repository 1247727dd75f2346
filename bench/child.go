package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
)

// childCmd is the hidden subcommand the parent re-executes itself with, so
// each run has its own process: its own peak RSS and CPU time.
const childCmd = "__scenario"

// childResult is what a child writes to its -result file.
type childResult struct {
	Count         int64   `json:"count"`
	JoinSeconds   float64 `json:"join_s"`   // start of Consume → first record done
	SteadySeconds float64 `json:"steady_s"` // first record done → quota-th done
	MsgsPerSec    float64 `json:"msgs_per_sec"`
	// SteadyCPUMicrosPerMsg is the process's CPU (user + sys) from the
	// first record done to the quota-th, per record: the join left out.
	SteadyCPUMicrosPerMsg float64 `json:"steady_cpu_us_per_msg"`
	// SteadyAllocsPerMsg and SteadyBytesPerMsg are the process's heap
	// allocations over the same span, per record (what -benchmem calls
	// allocs/op and B/op): the client's, the harness's and the consumer's.
	SteadyAllocsPerMsg float64 `json:"steady_allocs_per_msg"`
	SteadyBytesPerMsg  float64 `json:"steady_bytes_per_msg"`
	LatencyN           int     `json:"latency_n,omitempty"`
	P50ms              float64 `json:"p50_ms,omitempty"`
	P95ms              float64 `json:"p95_ms,omitempty"`
	P99ms              float64 `json:"p99_ms,omitempty"`
	// Breakdown: where the latency run's records spent their time, for a
	// Breakdown scenario.
	Breakdown *breakdown `json:"breakdown,omitempty"`
}

// childArgs are the flags of the child subcommand.
type childArgs struct {
	scenario, topic, group, result string
	limit                          int
	latency                        bool
	warmup                         time.Duration
	timeout                        time.Duration
	cpuprofile, memprofile         string
	pgConns, partitions            int
}

func (a childArgs) argv() []string {
	v := []string{childCmd,
		"-scenario", a.scenario, "-topic", a.topic, "-group", a.group, "-result", a.result,
		"-limit", fmt.Sprint(a.limit), "-timeout", a.timeout.String(), "-pg-conns", fmt.Sprint(a.pgConns), "-partitions", fmt.Sprint(a.partitions)}
	if a.latency {
		v = append(v, "-latency", "-warmup", a.warmup.String())
	}
	if a.cpuprofile != "" {
		v = append(v, "-cpuprofile", a.cpuprofile)
	}
	if a.memprofile != "" {
		v = append(v, "-memprofile", a.memprofile)
	}
	return v
}

func childMain(args []string) error {
	var a childArgs
	fs := flag.NewFlagSet(childCmd, flag.ContinueOnError)
	fs.StringVar(&a.scenario, "scenario", "", "scenario name")
	fs.StringVar(&a.topic, "topic", "", "topic to read")
	fs.StringVar(&a.group, "group", "", "consumer group")
	fs.StringVar(&a.result, "result", "", "where to write the result JSON")
	fs.IntVar(&a.limit, "limit", 0, "records to consume")
	fs.BoolVar(&a.latency, "latency", false, "record end-to-end latency of every record")
	fs.DurationVar(&a.warmup, "warmup", time.Second, "latency: leave out records stamped within this of the first")
	fs.DurationVar(&a.timeout, "timeout", 10*time.Minute, "give up after")
	fs.StringVar(&a.cpuprofile, "cpuprofile", "", "write a CPU profile")
	fs.StringVar(&a.memprofile, "memprofile", "", "write an allocation profile")
	fs.IntVar(&a.pgConns, "pg-conns", 16, "pgx pool size")
	fs.IntVar(&a.partitions, "partitions", 12, "partitions of the harness's topics (writers of a scenario without Kafka)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := lookup(a.scenario)
	if err != nil {
		return err
	}
	if a.limit <= 0 {
		return errors.New("-limit must be positive")
	}

	ctx, stop := context.WithTimeout(context.Background(), a.timeout)
	defer stop()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	e := &Env{Brokers: brokers(), Topic: a.topic, Group: a.group, Partitions: a.partitions}
	if s.Breakdown && a.latency {
		e.phases = newPhases()
	}
	if s.PG {
		if e.Pool, err = openPool(ctx, a.pgConns); err != nil {
			return err
		}
		defer e.Pool.Close()
	}

	if a.cpuprofile != "" {
		f, err := os.Create(a.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if a.memprofile != "" {
		runtime.MemProfileRate = 64 << 10 // finer than the default 512 KiB
	}

	e.Meter = newMeter(a.limit, a.latency, a.warmup, cancel)
	if err := s.Consume(runCtx, e); err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: consumed %d of %d records within %v: %w", s.Name, e.Meter.n.Load(), a.limit, a.timeout, err)
	}
	if n := e.Meter.n.Load(); n < int64(a.limit) {
		return fmt.Errorf("%s: returned after %d of %d records", s.Name, n, a.limit)
	}

	if a.memprofile != "" {
		if err := writeProfile("allocs", a.memprofile); err != nil {
			return err
		}
	}
	res := e.Meter.result()
	if e.phases != nil {
		res.Breakdown = e.phases.result(a.warmup)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(a.result, b, 0o644)
}

func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// openPool opens the pool of the PG scenarios and makes sure their tables exist.
func openPool(ctx context.Context, conns int) (*pgxpool.Pool, error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return nil, errors.New("DATABASE_URL is not set (run through `make bench`, which reads .state/services.env)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := dedupe.NewPostgres(pool).Migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate inbox: %w", err)
	}
	if _, err := pool.Exec(ctx, rowsDDL); err != nil {
		pool.Close()
		return nil, fmt.Errorf("create %s: %w", rowsTable, err)
	}
	return pool, nil
}

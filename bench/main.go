// Command idem-bench measures idem beside raw sarama, raw franz-go (kgo),
// Watermill, a hand-written dedupe loop, a hand-written consume-and-insert
// loop and PostgreSQL alone, on the same topic data, against the
// real Kafka and PostgreSQL of KAFKA_BROKERS and DATABASE_URL (`make bench`
// reads them from .state/services.env).
//
// For every scenario of the registry (scenarios.go) it runs -runs child
// processes, each a fresh consumer group reading the scenario's quota of the
// shared topic, and reports the median steady throughput (first record done
// to last), the group's join time apart, the peak RSS and CPU seconds of the
// child; then end-to-end latency (record timestamp → handler done / offset
// marked) with records produced at half the scenario's throughput into a
// fresh topic. It prints a Markdown table, writes JSON and a PNG chart.
//
//	make bench                                  # everything, defaults
//	make bench BENCHARGS='-records 200000 -runs 1'
//	make bench BENCHARGS='-only "idem memory" -runs 1 -cpuprofile cpu.pprof'
//	make bench BENCHARGS='-flat-rss 1000000,4000000'
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	records, size, partitions, runs int
	only                            string
	out                             string
	fresh                           bool
	latDuration, latWarmup          time.Duration
	latMaxRate                      float64
	noLatency                       bool
	cpuprofile, memprofile, profile string
	flatRSS, flatScenarios          string
	pgConns                         int
	childTimeout                    time.Duration
	redraw                          string
	outboxDuration                  time.Duration // outbox.go
	outboxRates                     string
	outboxRows                      int
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == childCmd {
		if err := childMain(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "idem-bench child:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.IntVar(&o.records, "records", 1_000_000, "records in the shared topic (each scenario reads at most its own limit)")
	flag.IntVar(&o.size, "size", 200, "value size of each record, bytes")
	flag.IntVar(&o.partitions, "partitions", 12, "partitions of the shared topic")
	flag.IntVar(&o.runs, "runs", 3, "runs per scenario; the table shows the median")
	flag.StringVar(&o.only, "only", "", "comma-separated scenario names or slugs to run (default: all but the extra ones)")
	flag.StringVar(&o.out, "out", "bench/out", "directory for the JSON, the PNG and the profiles")
	flag.BoolVar(&o.fresh, "fresh", false, "recreate the data topic even if one with the same shape exists")
	flag.DurationVar(&o.latDuration, "latency-duration", 10*time.Second, "length of each scenario's latency load; 0 skips latency")
	flag.DurationVar(&o.latWarmup, "latency-warmup", time.Second, "the latency load's first records left out of the percentiles (produced on top of -latency-duration)")
	flag.Float64Var(&o.latMaxRate, "latency-max-rate", 25_000, "cap on the latency load's rate, msgs/s (the producer shares the 2 cores)")
	flag.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the -profile scenario's first run to this file (several scenarios: cpu.pprof → cpu-<slug>.pprof)")
	flag.StringVar(&o.memprofile, "memprofile", "", "write an allocation profile of the -profile scenario's first run to this file (named as -cpuprofile's)")
	flag.StringVar(&o.profile, "profile", "idem memory", "the scenario, or comma-separated scenarios, -cpuprofile and -memprofile profile")
	flag.StringVar(&o.flatRSS, "flat-rss", "", "instead of the scenarios: comma-separated backlog sizes (e.g. 1000000,4000000) to run -flat-scenarios over and compare peak RSS")
	flag.StringVar(&o.flatScenarios, "flat-scenarios", "idem memory,idem no store", "scenarios of -flat-rss")
	flag.IntVar(&o.pgConns, "pg-conns", 16, "pgx pool size of the PostgreSQL scenarios (≥ partitions)")
	flag.DurationVar(&o.childTimeout, "child-timeout", 5*time.Minute, "a run that has not consumed its quota by then fails")
	flag.StringVar(&o.redraw, "redraw", "", "only redraw the PNG chart of this JSON report (next to it)")
	flag.DurationVar(&o.outboxDuration, "outbox-duration", 10*time.Second, "outbox relay benchmark (outbox.go): length of each rate's latency load; 0 skips it; -only outbox runs it alone")
	flag.StringVar(&o.outboxRates, "outbox-rates", "1000,10000", "outbox relay benchmark: offered rates, events/s")
	flag.IntVar(&o.outboxRows, "outbox-rows", 100_000, "outbox relay benchmark: backlog rows for the relay's throughput")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: idem-bench [flags]\n\nScenarios:\n")
		for _, s := range registry {
			extra := ""
			if s.Extra {
				extra = " (extra: only with -only or -flat-rss)"
			}
			fmt.Fprintf(flag.CommandLine.Output(), "  %-24s %s%s\n", s.Slug(), s.Name, extra)
		}
		fmt.Fprintln(flag.CommandLine.Output(), "\nFlags:")
		flag.PrintDefaults()
	}
	flag.Parse()
	o.noLatency = o.latDuration <= 0

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "idem-bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.records <= 0 || o.size <= 0 || o.partitions <= 0 || o.runs <= 0 {
		return fmt.Errorf("-records, -size, -partitions and -runs must be positive")
	}
	if _, err := selectScenarios(o.profile); o.profile != "" && err != nil {
		return fmt.Errorf("-profile: %w", err)
	}
	if o.redraw != "" {
		return redraw(o.redraw)
	}
	if err := os.MkdirAll(o.out, 0o755); err != nil {
		return err
	}
	if o.flatRSS != "" {
		var sizes []int
		for f := range strings.SplitSeq(o.flatRSS, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return fmt.Errorf("-flat-rss: %q is not a record count", f)
			}
			sizes = append(sizes, n)
		}
		scen, err := selectScenarios(o.flatScenarios)
		if err != nil {
			return fmt.Errorf("-flat-scenarios: %w", err)
		}
		return runFlatRSS(ctx, o, sizes, scen)
	}
	if o.only == "outbox" {
		return runOutboxBench(ctx, o)
	}
	scen, err := selectScenarios(o.only)
	if err != nil {
		return fmt.Errorf("-only: %w", err)
	}
	if err := runBench(ctx, o, scen); err != nil || o.only != "" || o.outboxDuration <= 0 {
		return err
	}
	return runOutboxBench(ctx, o)
}

// selectScenarios resolves a comma-separated list; empty means the default
// run (every scenario not marked Extra), in registry order.
func selectScenarios(list string) ([]Scenario, error) {
	if strings.TrimSpace(list) == "" {
		var out []Scenario
		for _, s := range registry {
			if !s.Extra {
				out = append(out, s)
			}
		}
		return out, nil
	}
	var out []Scenario
	for name := range strings.SplitSeq(list, ",") {
		s, err := lookup(strings.TrimSpace(name))
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

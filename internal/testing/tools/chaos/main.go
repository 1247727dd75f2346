// Command chaos is `make chaos` and `make chaos-ci`: it runs the payments
// example's consumer in every processing mode as three OS processes against
// its own Kafka broker and PostgreSQL server, injects faults while a producer
// sends payments, duplicates and poison records, and checks the whole history
// (package internal/testing/chaos/check). It exits 1 when any invariant is violated.
//
// With -brokers 3 the run has a three-node Kafka cluster of its own (ports
// -kafka-port, +2, +4 and -controller-port, +2, +4), idem's topics have
// replication factor 3 and min.insync.replicas=2, and the broker faults are
// the cluster's: SIGKILL of a source partition's leader, of a tier or DLQ
// partition's leader, of the group coordinator and of the transaction
// coordinator, a leader frozen with SIGSTOP past the session timeouts, and a
// rolling restart of all three nodes (docs/guarantees-cluster.md).
//
//	go run ./internal/testing/tools/chaos [-ci] [-brokers 3] [-modes per-message,lanes] [-payments 50000] …
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/idemhq/idem/internal/testing/chaos"
)

var allModes = []string{"per-message", "batched", "batch-handler", "lanes", "ordering"}

// txnModes are the modes -transactions runs: every mode, ByKey ordering
// included (issue 20).
var txnModes = []string{"per-message", "batched", "batch-handler", "lanes", "ordering"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx)
	stop()
	os.Exit(code)
}

func run(ctx context.Context) int {
	ci := flag.Bool("ci", false, "the short form for CI: fewer records, shorter faults (every fault kind and every mode still)")
	brokers := flag.Int("brokers", 1, "Kafka nodes: 1 (one broker, replication 1) or 3 (a three-node cluster, replication 3, min.insync.replicas 2, the cluster faults)")
	modes := flag.String("modes", "", "modes to run, comma-separated (default: "+strings.Join(allModes, ",")+"; with -transactions: "+strings.Join(txnModes, ",")+")")
	transactions := flag.Bool("transactions", false, "transactional mode: members with Config.Transactions, the relay with ExactlyOnce; the checker reads the DLQ, the tiers and the events as a read_committed reader and wants exactly one copy per hop")
	payments := flag.Int("payments", 0, "unique payments per mode (default 50000, -ci 2000)")
	produceFor := flag.Duration("produce-for", 0, "the producer spreads its records over this long; the faults happen meanwhile (default 80s, -ci 36s; with -brokers 3: 300s, -ci 200s)")
	killEvery := flag.Duration("kill-every", 0, "a random member is SIGKILLed this often (default 4s, -ci 5s)")
	freezeFor := flag.Duration("freeze-for", 0, "how long the broker is SIGSTOPped; more than the 10s session timeout (default 16s, -ci 13s)")
	drainTimeout := flag.Duration("drain-timeout", 5*time.Minute, "how long the group may take to catch up after the faults")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "random seed (printed, so a run can be repeated)")
	static := flag.Bool("static", false, "the static-membership figure instead of the modes: 3 members (per-message) on a 12-partition topic consume a backlog of -payments records (default 150000, -ci 40000); a calm phase and a phase in which one member is SIGKILLed and restarted every -kill-every (default 5s) last -static-window each; run with InstanceIDs, then without (the dynamic counter-run); PASS wants >= 0.5 x the calm throughput and the group's generation unchanged")
	staticWindow := flag.Duration("static-window", 0, "with -static: how long the calm phase and the kill phase each last (default 40s, -ci 20s)")
	race := flag.Bool("race", false, "build the members with the race detector")
	kport := flag.Int("kafka-port", 19092, "the chaos broker's port")
	cport := flag.Int("controller-port", 19093, "the chaos broker's controller port")
	pgport := flag.Int("pg-port", 15432, "the chaos PostgreSQL's port")
	state := flag.String("state", ".state/chaos", "the chaos broker's state and the run logs")
	flag.Parse()

	def := func(d *time.Duration, full, short time.Duration) {
		if *d == 0 {
			*d = full
			if *ci {
				*d = short
			}
		}
	}
	if *brokers != 1 && *brokers != 3 {
		fmt.Fprintf(os.Stderr, "chaos: -brokers %d: want 1 or 3\n", *brokers)
		return 2
	}
	if eph := chaos.EphemeralPorts(*kport, *cport, *pgport, *kport+2, *kport+4, *cport+2, *cport+4); len(eph) > 0 {
		fmt.Fprintf(os.Stderr, "chaos: warning: ports %v are in the kernel's ephemeral range, where an outgoing connection may take one while a fault has its server down; pick ports below 32768\n", eph)
	}
	if *brokers == 3 {
		// The cluster's faults each wait for a failover and a node's restart
		// (about 25 s each, a rolling restart about 50 s; about 170 s in
		// all): production lasts long enough for them to happen while
		// records still arrive.
		def(produceFor, 300*time.Second, 200*time.Second)
	}
	def(produceFor, 80*time.Second, 36*time.Second)
	if *static {
		def(killEvery, 5*time.Second, 5*time.Second)
		def(staticWindow, 40*time.Second, 20*time.Second)
		if *payments == 0 {
			*payments = 150000
			if *ci {
				*payments = 40000
			}
		}
	}
	def(killEvery, 4*time.Second, 5*time.Second)
	def(freezeFor, 16*time.Second, 13*time.Second)
	if *payments == 0 {
		*payments = 50000
		if *ci {
			*payments = 2000
		}
	}
	valid := allModes
	if *transactions {
		valid = txnModes
	}
	if *modes == "" {
		*modes = strings.Join(valid, ",")
	}
	ms := strings.Split(*modes, ",")
	for _, m := range ms {
		if !slices.Contains(valid, m) {
			fmt.Fprintf(os.Stderr, "chaos: unknown mode %q (want %s)\n", m, strings.Join(valid, ", "))
			return 2
		}
	}
	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	stateDir, _ := filepath.Abs(*state)
	runDir := filepath.Join(stateDir, "runs", time.Now().UTC().Format("20060102-150405"))
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	logf := func(format string, args ...any) {
		fmt.Printf("%s chaos: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	logf("seed %d, %d Kafka node(s), %d payments per mode over %s, kill every %s, freeze %s, transactions %v; logs in %s", *seed, *brokers, *payments, *produceFor, *killEvery, *freezeFor, *transactions, runDir)

	// The members run the reference service with the harness's hooks
	// (history, ledger, injected failures): internal/testing/chaos/member.
	bin := filepath.Join(runDir, "chaos-member")
	build := []string{"build", "-o", bin}
	if *race {
		build = append(build, "-race")
	}
	if out, err := exec.CommandContext(ctx, "go", append(build, "./internal/testing/chaos/member")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: build the member: %v\n%s", err, out)
		return 2
	}
	svc := &chaos.Services{Root: root, State: stateDir, KafkaPort: *kport, ControllerPort: *cport, PGPort: *pgport, Nodes: *brokers, Log: logf}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := svc.Stop(sctx); err != nil {
			logf("stopping the services: %v", err)
		}
	}()
	if err := svc.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	logf("Kafka on %s", strings.Join(svc.Brokers(), ","))

	if *static {
		so := chaos.StaticOptions{Services: svc, Bin: bin, Dir: runDir, Backlog: *payments, Window: *staticWindow, KillEvery: *killEvery, Seed: *seed, Logf: logf}
		return runStatic(ctx, so)
	}
	w := chaos.Workload{Payments: *payments, Customers: max(50, *payments/100), DupRate: 0.15, Poison: 0.004, Rivals: 0.005, Flaky: 0.02, Huge: 0.002}
	opts := chaos.Options{Services: svc, Bin: bin, Dir: runDir, Workload: w, Seed: *seed, ProduceFor: *produceFor,
		KillEvery: *killEvery, FreezeFor: *freezeFor, DrainTimeout: *drainTimeout, Transactions: *transactions, Logf: logf}
	failed := false
	var sums []*chaos.Summary
	total := time.Now()
	for _, m := range ms {
		sum, err := chaos.RunMode(ctx, opts, m)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: mode %s: %v\n", m, err)
			return 2
		}
		fmt.Printf("\n== mode %s: %d records, %s, faults %v\n", m, sum.Produced, sum.Elapsed.Round(time.Second), sum.Faults)
		printInjected(sum)
		sum.Report.Print(os.Stdout)
		fmt.Println()
		if !sum.Report.OK() {
			failed = true
		}
		sums = append(sums, sum)
	}
	fmt.Printf("== summary (seed %d, %s in all)\n", *seed, time.Since(total).Round(time.Second))
	for _, s := range sums {
		verdict := "PASS"
		if !s.Report.OK() {
			verdict = "FAIL " + strings.Join(s.Report.Failed(), "; ")
		}
		fmt.Printf("  %-14s %6d records %5s  %s\n", s.Mode, s.Produced, s.Elapsed.Round(time.Second), verdict)
	}
	if failed {
		return 1
	}
	return 0
}

// printInjected prints the mode's faults other than the members' SIGKILLs,
// each with what it found.
func printInjected(sum *chaos.Summary) {
	for _, f := range sum.Injected {
		fmt.Printf("   %s %-20s (%s) %s\n", f.Start.UTC().Format("15:04:05"), f.Kind, f.End.Sub(f.Start).Round(100*time.Millisecond), f.Detail)
	}
}

// runStatic runs the static-membership figure, then its dynamic
// counter-run, and prints both; it returns 1 when the static run misses the
// goal.
func runStatic(ctx context.Context, o chaos.StaticOptions) int {
	var rs []*chaos.StaticResult
	for _, static := range []bool{true, false} {
		r, err := chaos.RunStatic(ctx, o, static)
		if err != nil {
			fmt.Fprintf(os.Stderr, "chaos: static=%v: %v\n", static, err)
			return 2
		}
		rs = append(rs, r)
	}
	fmt.Printf("\n== static membership: 3 members, 12 partitions, one member SIGKILLed and restarted every %s; phases of %s\n", o.KillEvery, o.Window)
	code := 0
	for _, r := range rs {
		r.Print(os.Stdout)
		verdict := "PASS"
		if f := r.Failed(); len(f) > 0 {
			verdict = "FAIL " + strings.Join(f, "; ")
			if r.Static {
				code = 1
			}
		}
		if r.Static {
			fmt.Printf("  %s (goal: >= 0.50 x calm and the generation unchanged)\n", verdict)
		} else {
			fmt.Printf("  counter-run (not held to the goal): %.2f x calm, generation %d -> %d%s\n", r.Ratio(), r.GenBefore, r.GenAfter,
				map[bool]string{true: "", false: "; " + strings.Join(r.Failed(), "; ")}[len(r.Failed()) == 0])
		}
	}
	return code
}

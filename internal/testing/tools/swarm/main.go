// Command swarm is `make swarm` and `make swarm-ci` (issue 28, "Prove every
// crossing"): it draws a configuration of the consumer, a workload and a
// fault schedule from each seed (internal/testing/chaos/draw), runs it against a
// Kafka broker (or three-node cluster) and a PostgreSQL server of its own
// (internal/testing/chaos, RunSwarm), checks the whole history
// (internal/testing/chaos/check), and ends with a table: seeds run, how often each
// pair of features was drawn together, faults by kind, violations. It exits
// 1 when any seed broke an invariant (or, with -budget, when a feature or a
// fault kind was never drawn).
//
//	go run ./internal/testing/tools/swarm -seed 7                 # one seed
//	go run ./internal/testing/tools/swarm -seeds 20               # seeds 7, 8, … (the first from the clock)
//	go run ./internal/testing/tools/swarm -duration 1h            # the soak: seeds until an hour has passed
//	go run ./internal/testing/tools/swarm -ci -race -budget 8m    # the CI form: every feature and fault kind at least once
//	go run ./internal/testing/tools/swarm -seed 7 -shrink         # the smallest failing draw of seed 7
//	go run ./internal/testing/tools/swarm -seed 7 -print-draw     # the draw only, as JSON
//	go run ./internal/testing/tools/swarm -ci -proof all          # the checker's own proof: each mechanism switched off
//
// A failing seed prints the command that reruns its exact draw. Each run of
// several seeds forces the features and fault kinds not drawn yet into
// later seeds (-force in their rerun commands), so that a run of N seeds
// draws every one at least once.
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
	"github.com/idemhq/idem/internal/testing/chaos/draw"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx)
	stop()
	os.Exit(code)
}

// listFlag is a comma-separated list flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// options are the command's flags.
type options struct {
	seed                  uint64
	seeds                 int
	duration, budget      time.Duration
	ci, shrink, printDraw bool
	race                  bool
	brokers               int
	force, drop           listFlag
	tags                  string
	memberEnv             listFlag
	kport, cport, pgport  int
	state                 string
	drainTimeout          time.Duration
	proof                 listFlag // mutations to prove (-proof), "all" for every one
	proofSeeds            int
	ports                 string // the port flags, for rerun commands
}

func run(ctx context.Context) int {
	var o options
	flag.Uint64Var(&o.seed, "seed", uint64(time.Now().UnixNano()), "the first seed (printed, so that a run can be repeated)")
	flag.IntVar(&o.seeds, "seeds", 0, "seeds to run: -seed, -seed+1, … (default 1; with -duration or -budget: as many as fit)")
	flag.DurationVar(&o.duration, "duration", 0, "the soak: run seeds until this long has passed (each seed runs to its end)")
	flag.DurationVar(&o.budget, "budget", 0, "the CI form: the whole run's budget (the member's build and the services' start included): start no seed that would likely end past it; force every feature and fault kind into the seeds that fit, and fail if one was never drawn")
	flag.BoolVar(&o.ci, "ci", false, "short draws: fewer records, a shorter production (25s)")
	flag.BoolVar(&o.shrink, "shrink", false, "run -seed's draw; if it fails, drop its faults and features one at a time while it still fails, and print the smallest failing draw")
	flag.BoolVar(&o.printDraw, "print-draw", false, "print -seed's draw (JSON) and exit: no services, nothing run")
	flag.BoolVar(&o.race, "race", false, "build the members with the race detector")
	flag.IntVar(&o.brokers, "brokers", 1, "Kafka nodes: 1, or 3 (replication 3, min.insync.replicas 2, and leader and coordinator kills among the faults)")
	flag.Var(&o.force, "force", "features and fault kinds to draw in every seed (comma-separated; names in -print-draw's output and the table)")
	flag.Var(&o.drop, "drop", "features, fault kinds or faults (by id, e.g. kill#2) to leave out of every seed")
	flag.StringVar(&o.tags, "tags", "", "build tags of the members (e.g. idem_mutate, for a mutation switch named by -member-env)")
	flag.Var(&o.memberEnv, "member-env", "NAME=VALUE pairs for the members' environment (comma-separated or repeated)")
	flag.IntVar(&o.kport, "kafka-port", 19092, "the swarm's broker port (three nodes: this, +2, +4)")
	flag.IntVar(&o.cport, "controller-port", 19093, "the swarm's controller port (three nodes: this, +2, +4)")
	flag.IntVar(&o.pgport, "pg-port", 15432, "the swarm's PostgreSQL port")
	flag.StringVar(&o.state, "state", ".state/swarm", "the swarm's broker state and the run logs")
	flag.DurationVar(&o.drainTimeout, "drain-timeout", 0, "how long a seed's group may go without progress while it drains after its faults (default 2m, -ci 90s; at most eight times that in all while it keeps making progress)")
	flag.Var(&o.proof, "proof", "the checker's own proof: for each mutation named (internal/mutate; \"all\" for every one), members built with -tags idem_mutate and that mechanism switched off, seeds from -seed until one fails (at most -proof-seeds); prints the table of seeds to find each breach")
	flag.IntVar(&o.proofSeeds, "proof-seeds", 3, "with -proof: the most seeds run per mutation")
	flag.Parse()
	if len(o.proof) > 0 {
		o.proofDefaults()
	}
	o.ports = fmt.Sprintf("-kafka-port %d -controller-port %d -pg-port %d", o.kport, o.cport, o.pgport)
	if eph := chaos.EphemeralPorts(o.kport, o.cport, o.pgport, o.kport+2, o.kport+4, o.cport+2, o.cport+4); len(eph) > 0 {
		fmt.Fprintf(os.Stderr, "swarm: warning: ports %v are in the kernel's ephemeral range, where an outgoing connection may take one while a fault has its server down; pick ports below 32768\n", eph)
	}
	if o.drainTimeout == 0 {
		o.drainTimeout = 2 * time.Minute
		if o.ci {
			o.drainTimeout = 90 * time.Second
		}
	}
	spec := draw.Spec{Seed: o.seed, Nodes: o.brokers, CI: o.ci, Force: o.force, Drop: o.drop}
	if _, err := draw.Generate(spec); err != nil {
		fmt.Fprintln(os.Stderr, "swarm:", err)
		return 2
	}
	if o.printDraw {
		d, _ := draw.Generate(spec)
		fmt.Println(d.JSON())
		return 0
	}

	root, err := os.Getwd()
	if err != nil {
		fmt.Fprintln(os.Stderr, "swarm:", err)
		return 2
	}
	stateDir, _ := filepath.Abs(o.state)
	runDir := filepath.Join(stateDir, "runs", time.Now().UTC().Format("20060102-150405"))
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "swarm:", err)
		return 2
	}
	logf := func(format string, args ...any) {
		fmt.Printf("%s swarm: %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	total := time.Now()
	bin := filepath.Join(runDir, "swarm-member")
	build := []string{"build", "-o", bin}
	if o.race {
		build = append(build, "-race")
	}
	if o.tags != "" {
		build = append(build, "-tags", o.tags)
	}
	if out, err := exec.CommandContext(ctx, "go", append(build, "./internal/testing/chaos/swarmmember")...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "swarm: build the member: %v\n%s", err, out)
		return 2
	}
	logf("member built (race %v, tags %q) in %s; logs in %s", o.race, o.tags, time.Since(total).Round(time.Second), runDir)
	svc := &chaos.Services{Root: root, State: stateDir, KafkaPort: o.kport, ControllerPort: o.cport, PGPort: o.pgport, Nodes: o.brokers, Log: logf}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := svc.Stop(sctx); err != nil {
			logf("stopping the services: %v", err)
		}
	}()
	if err := svc.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "swarm:", err)
		return 2
	}
	logf("Kafka on %s, PostgreSQL on %d", strings.Join(svc.Brokers(), ","), o.pgport)
	r := &runner{o: o, svc: svc, bin: bin, dir: runDir, logf: logf}
	if len(o.proof) > 0 {
		return r.proof(ctx, spec, o.proof, o.proofSeeds)
	}
	if o.shrink {
		return r.shrink(ctx, spec)
	}
	return r.seeds(ctx, spec, total)
}

// runner runs draws on one set of services.
type runner struct {
	o    options
	svc  *chaos.Services
	bin  string
	dir  string
	logf func(string, ...any)
	n    int // runs so far (names each run's topics and database)
}

// one runs spec's draw and prints its verdict.
func (r *runner) one(ctx context.Context, spec draw.Spec) (*chaos.SwarmResult, error) {
	d, err := draw.Generate(spec)
	if err != nil {
		return nil, err
	}
	r.n++
	res, err := chaos.RunSwarm(ctx, chaos.SwarmOptions{Services: r.svc, Bin: r.bin, Dir: r.dir, Run: fmt.Sprintf("r%d", r.n),
		DrainTimeout: r.o.drainTimeout, MemberEnv: slices.Clone(r.o.memberEnv), Logf: r.logf}, d)
	if err != nil {
		return nil, fmt.Errorf("seed %d: %w", spec.Seed, err)
	}
	verdict := "PASS"
	if !res.Report.OK() {
		verdict = "FAIL " + strings.Join(res.Report.Failed(), "; ")
	}
	fmt.Printf("\n== seed %d (run %d): %d records, %s: %s\n   %s\n", spec.Seed, r.n, res.Produced, res.Elapsed.Round(time.Second), verdict, d.Summary())
	for _, f := range res.Injected {
		fmt.Printf("   %s %-20s (%s) %s\n", f.Start.UTC().Format("15:04:05"), f.Kind, f.End.Sub(f.Start).Round(100*time.Millisecond), f.Detail)
	}
	res.Report.Print(os.Stdout)
	if !res.Report.OK() {
		fmt.Printf("   logs: %s\n   rerun: %s\n", res.Dir, r.rerun(spec))
	}
	return res, nil
}

// rerun is the one-line command that reruns spec's draw.
func (r *runner) rerun(spec draw.Spec) string {
	extra := ""
	if r.o.race {
		extra += " -race"
	}
	if r.o.tags != "" {
		extra += " -tags " + r.o.tags
	}
	if len(r.o.memberEnv) > 0 {
		extra += " -member-env " + strings.Join(r.o.memberEnv, ",")
	}
	return fmt.Sprintf("make swarm SWARM_PORTS='%s -brokers %d' SWARMARGS='%s%s'", r.o.ports, max(spec.Nodes, 1), spec.Args(), extra)
}

// seeds runs seed after seed, forcing what is not drawn yet, and prints the
// table.
func (r *runner) seeds(ctx context.Context, first draw.Spec, total time.Time) int {
	tally := draw.NewTally(r.o.brokers)
	start := time.Now()
	spent := start.Sub(total) // the build and the services' start: part of -budget
	planned := r.o.seeds
	if planned == 0 && r.o.duration == 0 && r.o.budget == 0 {
		planned = 1
	}
	var perSeed time.Duration // the mean so far
	code := 0
	for i := 0; ; i++ {
		elapsed := time.Since(start)
		if i > 0 {
			perSeed = elapsed / time.Duration(i)
		}
		remaining := planned - i
		switch {
		case planned > 0 && remaining <= 0:
		case r.o.duration > 0 && elapsed >= r.o.duration:
			remaining = 0
		case r.o.budget > 0 && i > 0 && spent+elapsed+perSeed > r.o.budget:
			remaining = 0
			if u := tally.Uncovered(); len(u) > 0 { // coverage before the budget: one more seed, with all of them
				r.logf("the budget is spent but %s were never drawn: one more seed draws them", strings.Join(u, ", "))
				remaining = 1
			}
		case planned == 0 && r.o.duration > 0:
			remaining = max(int((r.o.duration-elapsed)/max(perSeed, 2*time.Minute)), 1)
		case planned == 0:
			est := perSeed
			if est == 0 {
				est = 2 * time.Minute // a first guess at one seed on a loaded machine
			}
			remaining = max(int((r.o.budget-spent-elapsed)/est), 1)
		}
		if remaining <= 0 || ctx.Err() != nil {
			break
		}
		spec := first
		spec.Seed = first.Seed + uint64(i)
		switch {
		case r.o.budget > 0 || r.o.seeds > 1: // coverage over the run's seeds: only where there are several
			spec.Force = append(slices.Clone(first.Force), tally.ForceNext(remaining)...)
		case r.o.duration > 0 && elapsed > r.o.duration/2: // the soak's second half: pairs never drawn together
			spec.Force = append(slices.Clone(first.Force), tally.ForcePair()...)
		}
		res, err := r.one(ctx, spec)
		if err != nil {
			fmt.Fprintln(os.Stderr, "swarm:", err)
			return 2
		}
		tally.Add(res.Draw)
		if !res.Report.OK() {
			tally.Fail(r.rerun(spec), res.Report.Failed())
			code = 1
		}
		tally.Elapsed = time.Since(start)
	}
	fmt.Println()
	tally.Print(os.Stdout)
	fmt.Printf("first seed %d; %s in all (member build and services included)\n", first.Seed, time.Since(total).Round(time.Second))
	if r.o.budget > 0 {
		if u := tally.Uncovered(); len(u) > 0 {
			fmt.Printf("FAIL: never drawn within the budget: %s\n", strings.Join(u, ", "))
			code = 1
		}
	}
	if r.o.duration > 0 {
		if m := tally.MissingPairs(); len(m) > 0 {
			fmt.Printf("FAIL: %d pairs of features never drawn together in the soak\n", len(m))
			code = 1
		}
	}
	return code
}

// shrink runs spec; if it fails, it makes it smaller while it still fails
// one of the invariants it broke, and prints the smallest failing draw.
func (r *runner) shrink(ctx context.Context, spec draw.Spec) int {
	res, err := r.one(ctx, spec)
	if err != nil {
		fmt.Fprintln(os.Stderr, "swarm:", err)
		return 2
	}
	if res.Report.OK() {
		fmt.Printf("seed %d passed: nothing to shrink (a failure seen before may depend on timing; rerun it a few times)\n", spec.Seed)
		return 0
	}
	broke := res.Report.Failed()
	fails := func(s draw.Spec) (bool, error) {
		res, err := r.one(ctx, s)
		if err != nil {
			return false, err
		}
		return slices.ContainsFunc(res.Report.Failed(), func(n string) bool { return slices.Contains(broke, n) }), nil
	}
	small, err := draw.Shrink(spec, fails, r.logf)
	d, _ := draw.Generate(small)
	fmt.Printf("\n== the smallest failing draw found (it broke one of: %s)\n%s\n%s\nrerun: %s\n", strings.Join(broke, "; "), d.Summary(), d.JSON(), r.rerun(small))
	if err != nil {
		fmt.Fprintln(os.Stderr, "swarm: the shrink stopped early:", err)
		return 2
	}
	return 1
}

package chaos

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The static-membership figure (issue 20): three members on a 12-partition
// topic consume a backlog; a calm phase and a phase in which one member is
// SIGKILLed and restarted every few seconds are measured the same way
// (effects applied per second, from the run's chaos_effects ledger), and the
// group's generation is read from its coordinator before and after the
// kills. With static membership (Config.InstanceID) the restarts must not
// rebalance the group and throughput must stay at half the calm one or
// more; the dynamic counter-run shows what the same kills cost without it.

// staticPartitions is the figure's partition count (the 12).
const staticPartitions = 12

// StaticOptions configure one run of the static-membership figure.
type StaticOptions struct {
	Services  *Services
	Bin       string        // the payments-consumer binary
	Dir       string        // where the logs go (one subdirectory per run)
	Backlog   int           // payments produced before the members start
	Window    time.Duration // length of the calm phase and of the kill phase, each
	KillEvery time.Duration // one member is SIGKILLed and restarted this often in the kill phase
	Seed      uint64
	Logf      func(format string, args ...any)
}

// StaticResult is what one run of the figure measured.
type StaticResult struct {
	Static    bool          // members had InstanceIDs
	Group     string        //
	Calm      float64       // effects applied per second in the calm phase
	Killed    float64       // effects applied per second in the kill phase
	Kills     int           // SIGKILLs (each followed by a restart) in the kill phase
	GenBefore int32         // the group's generation at the end of the calm phase (coordinator's log)
	GenAfter  int32         // and once the group is Stable again after the kill phase
	Prepared  int           // "Preparing to rebalance" lines of the group logged meanwhile
	Reasons   []string      // their reasons, as the coordinator gave them (at most 5)
	State     string        // DescribeGroups after the kill phase: the group's state,
	Members   int           // its members
	StaticIDs int           // and how many have a group.instance.id
	LagEnd    int64         // records not yet committed when the kill phase ended (> 0: the backlog lasted)
	Elapsed   time.Duration //
}

// Ratio is the kill phase's throughput over the calm phase's.
func (r *StaticResult) Ratio() float64 {
	if r.Calm == 0 {
		return 0
	}
	return r.Killed / r.Calm
}

// Failed lists what the static run misses of the goal: throughput
// of the kill phase at least half the calm one, the generation unchanged
// (no rebalance), and a backlog that lasted (else the phases measured the
// producer). Only the static run is held to it.
func (r *StaticResult) Failed() []string {
	var out []string
	if r.LagEnd <= 0 {
		out = append(out, "the backlog ran out before the kill phase ended: the figure is not a throughput (raise -payments)")
	}
	if !r.Static {
		return out
	}
	if r.Ratio() < 0.5 {
		out = append(out, fmt.Sprintf("throughput under kills %.0f/s is %.2f x the calm %.0f/s, want >= 0.50", r.Killed, r.Ratio(), r.Calm))
	}
	if r.GenAfter != r.GenBefore || r.Prepared > 0 {
		out = append(out, fmt.Sprintf("generation %d -> %d, %d rebalances prepared: the restarts rebalanced the group", r.GenBefore, r.GenAfter, r.Prepared))
	}
	if r.Kills == 0 {
		out = append(out, "no member was killed")
	}
	return out
}

// Print writes the run's figures.
func (r *StaticResult) Print(w *os.File) {
	kind := "dynamic membership (no InstanceID)"
	if r.Static {
		kind = "static membership (InstanceID = the member's slot)"
	}
	fmt.Fprintf(w, "%s, group %s, %s:\n", kind, r.Group, r.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "  calm        %8.0f effects/s\n", r.Calm)
	fmt.Fprintf(w, "  under kills %8.0f effects/s  (%d SIGKILLs, each restarted): %.2f x calm\n", r.Killed, r.Kills, r.Ratio())
	fmt.Fprintf(w, "  generation  %d before the kills, %d after; %d rebalances prepared meanwhile\n", r.GenBefore, r.GenAfter, r.Prepared)
	for _, s := range r.Reasons {
		fmt.Fprintf(w, "    - %s\n", s)
	}
	fmt.Fprintf(w, "  group after: %s, %d members, %d with a group.instance.id; %d records left when the kills ended\n", r.State, r.Members, r.StaticIDs, r.LagEnd)
}

// RunStatic runs the figure once: with static membership when static, else
// the dynamic counter-run.
func RunStatic(ctx context.Context, o StaticOptions, static bool) (*StaticResult, error) {
	start := time.Now()
	name := "dynamic"
	if static {
		name = "static"
	}
	rnd := rand.New(rand.NewPCG(o.Seed, uint64(len(name))))
	run := fmt.Sprintf("%x", rnd.Uint32())
	topic, group, db := "payments-"+name, "chaos-"+name, "chaos_"+name
	events := topic + ".events"
	dir := filepath.Join(o.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	logf := func(f string, a ...any) { o.Logf("["+name+"] "+f, a...) }
	svc := o.Services
	if err := svc.CreateDB(ctx, db); err != nil {
		return nil, err
	}
	rf, cfg := int16(1), map[string]*string(nil)
	if svc.nodes() > 1 {
		rf, cfg = clusterRF, map[string]*string{"min.insync.replicas": new(clusterMinISR)}
	}
	for _, t := range []string{topic, events} {
		if err := createTopicN(svc.Brokers(), t, staticPartitions, rf, cfg); err != nil {
			return nil, err
		}
	}
	recs, orders := plan(Workload{Payments: o.Backlog, Customers: max(50, o.Backlog/100)}, run, rnd)

	var infra sync.RWMutex
	env := append(os.Environ(), "KAFKA_BROKERS="+strings.Join(svc.Brokers(), ","), "DATABASE_URL="+svc.DatabaseURL(db))
	args := []string{"-topic", topic, "-group", group, "-partitions", strconv.Itoa(staticPartitions), "-metrics-addr", "",
		"-mode", "per-message", "-retry-delays", retryDelays, "-events-topic", events}
	fl := newFleet(o.Bin, dir, args, env, &infra, logf)
	fl.instanceIDs = static
	defer fl.killAll()

	// The first member creates the schema; the orders go in, and it stops
	// before the backlog is produced, so that all three start on it.
	pool, err := firstMember(ctx, fl, svc.DatabaseURL(db), orders)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	fl.stop("m1", 40*time.Second)
	t0 := time.Now()
	if _, err := produce(ctx, svc.Brokers(), topic, recs, 0, filepath.Join(dir, "produced.jsonl"), o.Logf); err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	logf("%d records produced in %s; starting m1, m2, m3", len(recs), time.Since(t0).Round(100*time.Millisecond))
	slots := []string{"m1", "m2", "m3"}
	for _, s := range slots {
		if err := fl.start(s); err != nil {
			return nil, err
		}
	}
	if _, err := stableGroup(ctx, svc.Brokers(), group, len(slots), 2*time.Minute); err != nil {
		return nil, err
	}
	// A few seconds for the three to get going, then the calm phase.
	if err := sleep(ctx, 5*time.Second); err != nil {
		return nil, err
	}
	res := &StaticResult{Static: static, Group: group}
	calm0 := time.Now()
	if err := sleep(ctx, o.Window); err != nil {
		return nil, err
	}
	calm1 := time.Now()
	if res.GenBefore, err = generation(svc, group); err != nil {
		return nil, err
	}
	prepared0, _ := rebalances(svc, group)

	faults := &faultLog{}
	killCtx, stopKills := context.WithTimeout(ctx, o.Window)
	fl.killLoop(killCtx, o.KillEvery, func() []string { return slots }, rnd, faults)
	stopKills()
	kill1 := time.Now()
	res.Kills = len(faults.all())
	if lags, err := lagsOf(svc.Brokers(), group, []string{topic}); err == nil {
		for _, l := range lags {
			if l.Committed >= 0 {
				res.LagEnd += l.End - l.Committed
			} else {
				res.LagEnd += l.End
			}
		}
	} else {
		logf("lag after the kill phase: %v", err)
	}
	d, err := stableGroup(ctx, svc.Brokers(), group, len(slots), 2*time.Minute)
	if err != nil {
		return nil, err
	}
	res.State, res.Members = d.State, len(d.Members)
	for _, m := range d.Members {
		if m.GroupInstanceId != nil && *m.GroupInstanceId != "" {
			res.StaticIDs++
		}
	}
	if res.GenAfter, err = generation(svc, group); err != nil {
		return nil, err
	}
	prepared1, reasons := rebalances(svc, group)
	res.Prepared = prepared1 - prepared0
	if res.Prepared > 0 {
		res.Reasons = reasons[prepared0:min(prepared1, prepared0+5)]
	}
	calm, err := effectsBetween(ctx, pool, calm0, calm1)
	if err != nil {
		return nil, err
	}
	killed, err := effectsBetween(ctx, pool, calm1, kill1)
	if err != nil {
		return nil, err
	}
	res.Calm = float64(calm) / calm1.Sub(calm0).Seconds()
	res.Killed = float64(killed) / kill1.Sub(calm1).Seconds()
	res.Elapsed = time.Since(start)
	return res, nil
}

// effectsBetween counts the effects committed in [from, to).
func effectsBetween(ctx context.Context, pool *pgxpool.Pool, from, to time.Time) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM chaos_effects WHERE at >= $1 AND at < $2`, from, to).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count effects: %w", err)
	}
	return n, nil
}

// stableGroup polls DescribeGroups until group is Stable with want
// members, for up to timeout, and returns that description.
func stableGroup(ctx context.Context, brokers []string, group string, want int, timeout time.Duration) (*sarama.GroupDescription, error) {
	deadline := time.Now().Add(timeout)
	last := errors.New("not described yet")
	for time.Now().Before(deadline) {
		d, err := describeGroup(brokers, group)
		switch {
		case err != nil:
			last = err
		case d.State == "Stable" && len(d.Members) == want:
			return d, nil
		default:
			last = fmt.Errorf("state %s with %d members", d.State, len(d.Members))
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("group %s not Stable with %d members within %s: %w", group, want, timeout, last)
}

// describeGroup is DescribeGroups of group.
func describeGroup(brokers []string, group string) (*sarama.GroupDescription, error) {
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	ds, err := admin.DescribeConsumerGroups([]string{group})
	if err != nil {
		return nil, err
	}
	if len(ds) != 1 || ds[0].Err != sarama.ErrNoError {
		return nil, fmt.Errorf("describe group %s: %v", group, ds)
	}
	return ds[0], nil
}

// generation is group's generation as its coordinator last logged it
// ("Stabilized group G generation N"): DescribeGroups does not return the
// generation of a classic group, the coordinator's log does. Every node's log
// is read, since the coordinator may have moved.
func generation(svc *Services, group string) (int32, error) {
	re := regexp.MustCompile(`Stabilized group ` + regexp.QuoteMeta(group) + ` generation (\d+)`)
	var gen int32 = -1
	var stamp string
	err := svc.scanBrokerLogs(func(line string) {
		if m := re.FindStringSubmatch(line); m != nil && line >= stamp { // lines start with their time
			n, _ := strconv.Atoi(m[1])
			gen, stamp = int32(n), line
		}
	})
	if err == nil && gen < 0 {
		err = fmt.Errorf("no generation of group %s in the brokers' logs", group)
	}
	return gen, err
}

// rebalances counts the coordinator's "Preparing to rebalance group G" lines
// and returns their reasons, oldest first.
func rebalances(svc *Services, group string) (int, []string) {
	prefix := "Preparing to rebalance group " + group + " "
	re := regexp.MustCompile(`\(reason: ([^;)]*)`)
	var lines []string
	_ = svc.scanBrokerLogs(func(line string) {
		if strings.Contains(line, prefix) {
			lines = append(lines, line)
		}
	})
	slices.Sort(lines)
	var reasons []string
	for _, l := range lines {
		r := l
		if m := re.FindStringSubmatch(l); m != nil {
			r = m[1]
		}
		reasons = append(reasons, l[:min(len(l), 25)]+" "+r)
	}
	return len(lines), reasons
}

// scanBrokerLogs calls f with each line of every node's server.log.
func (s *Services) scanBrokerLogs(f func(line string)) error {
	var paths []string
	if s.nodes() == 1 {
		paths = []string{filepath.Join(s.State, "kafka", "server.log")}
	} else {
		for n := 1; n <= s.nodes(); n++ {
			paths = append(paths, filepath.Join(s.State, "kafka3", fmt.Sprintf("n%d", n), "server.log"))
		}
	}
	for _, p := range paths {
		fh, err := os.Open(p)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			f(sc.Text())
		}
		fh.Close()
		if err := sc.Err(); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	return nil
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// runResult is one child process's outcome.
type runResult struct {
	childResult
	PeakRSSBytes int64
	CPUSeconds   float64
}

// bench is the parent's state for one invocation.
type bench struct {
	o     options
	k     *kafka
	runID string
	exe   string
	pg    bool // some PG scenario ran: clean its rows up
}

func newBench(o options) (*bench, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	k, err := dialKafka()
	if err != nil {
		return nil, err
	}
	return &bench{o: o, k: k, exe: exe, runID: time.Now().UTC().Format("20060102t150405")}, nil
}

func (b *bench) close() {
	if b.pg {
		b.cleanRows()
	}
	b.k.close()
}

// dataTopic makes sure a topic of n records in the shape of the flags exists,
// reusing one left by an earlier run, and returns its name.
func (b *bench) dataTopic(ctx context.Context, n int) (string, error) {
	topic := fmt.Sprintf("idem-bench-data-r%d-s%d-p%d", n, b.o.size, b.o.partitions)
	have, parts, ok, err := b.k.records(topic)
	if err != nil {
		return "", fmt.Errorf("inspect %s: %w", topic, err)
	}
	if ok && !b.o.fresh && have == int64(n) && parts == b.o.partitions {
		logf("data: reusing %s (%d records)", topic, have)
		return topic, nil
	}
	if ok {
		logf("data: %s has %d records on %d partitions; recreating it", topic, have, parts)
		b.k.deleteTopics([]string{topic})
	}
	if err := b.k.createTopic(ctx, topic, b.o.partitions); err != nil {
		return "", err
	}
	start := time.Now()
	if err := produce(ctx, topic, "r", n, b.o.size, 0); err != nil {
		return "", err
	}
	have, _, _, err = b.k.records(topic)
	if err != nil {
		return "", err
	}
	if have != int64(n) {
		return "", fmt.Errorf("data: %s has %d records after producing %d", topic, have, n)
	}
	logf("data: produced %d records of %d bytes to %s in %.1fs (%.0f msgs/s)", n, b.o.size, topic,
		time.Since(start).Seconds(), float64(n)/time.Since(start).Seconds())
	return topic, nil
}

// group names a fresh consumer group.
func (b *bench) group(s Scenario, what string) string {
	return fmt.Sprintf("idem-bench-%s-%s-%s", b.runID, s.Slug(), what)
}

// child runs one child process to completion. started, if not nil, is called
// once the child is running (the latency load starts from it) and its error
// fails the run.
func (b *bench) child(ctx context.Context, a childArgs, started func(ctx context.Context, exited <-chan struct{}) error) (runResult, error) {
	a.result = filepath.Join(os.TempDir(), fmt.Sprintf("idem-bench-%d-%s.json", os.Getpid(), a.group))
	a.timeout = b.o.childTimeout
	a.pgConns = b.o.pgConns
	a.partitions = b.o.partitions
	defer os.Remove(a.result)
	cmd := exec.CommandContext(ctx, b.exe, a.argv()...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return runResult{}, err
	}
	exited := make(chan struct{})
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait(); close(exited) }()
	var startErr error
	if started != nil {
		if startErr = started(ctx, exited); startErr != nil {
			_ = cmd.Process.Kill()
		}
	}
	err := <-waitc
	// Cleanup: the group, and what idem creates per group ("<topic>.<group>.dlq", tiers).
	_ = b.k.admin.DeleteConsumerGroup(a.group)
	b.k.deleteTopics(nil, a.topic+"."+a.group+".")
	if startErr != nil {
		return runResult{}, startErr
	}
	if err != nil {
		return runResult{}, fmt.Errorf("child %s: %w", a.scenario, err)
	}
	var r runResult
	raw, err := os.ReadFile(a.result)
	if err != nil {
		return r, fmt.Errorf("child %s: result: %w", a.scenario, err)
	}
	if err := json.Unmarshal(raw, &r.childResult); err != nil {
		return r, fmt.Errorf("child %s: result: %w", a.scenario, err)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.PeakRSSBytes = ru.Maxrss * 1024 // KiB on Linux
	}
	r.CPUSeconds = (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	return r, nil
}

// throughput runs s -runs times over its quota of topic and takes medians.
func (b *bench) throughput(ctx context.Context, s Scenario, topic string, records int) (scenarioResult, error) {
	res := scenarioResult{Name: s.Name, Slug: s.Slug(), Records: s.limit(records), PG: s.PG}
	var runs []runResult
	for i := range b.o.runs {
		a := childArgs{scenario: s.Name, topic: topic, group: b.group(s, fmt.Sprint("run", i+1)), limit: res.Records}
		if i == 0 {
			a.cpuprofile, a.memprofile = b.profiles(s)
		}
		r, err := b.child(ctx, a, nil)
		if err != nil {
			return res, err
		}
		logf("  %-22s run %d: %9.0f msgs/s  join %.2fs  rss %4.0f MiB  cpu %.1fs (steady %.2f µs/msg, %.1f allocs/msg)", s.Name, i+1,
			r.MsgsPerSec, r.JoinSeconds, mib(r.PeakRSSBytes), r.CPUSeconds, r.SteadyCPUMicrosPerMsg, r.SteadyAllocsPerMsg)
		runs = append(runs, r)
		res.RunsMsgsPerSec = append(res.RunsMsgsPerSec, r.MsgsPerSec)
	}
	res.MsgsPerSec = median(runs, func(r runResult) float64 { return r.MsgsPerSec })
	res.JoinSeconds = median(runs, func(r runResult) float64 { return r.JoinSeconds })
	res.PeakRSSBytes = int64(median(runs, func(r runResult) float64 { return float64(r.PeakRSSBytes) }))
	res.CPUSeconds = median(runs, func(r runResult) float64 { return r.CPUSeconds })
	res.CPUMicrosPerMsg = res.CPUSeconds / float64(res.Records) * 1e6
	res.SteadyCPUMicrosPerMsg = median(runs, func(r runResult) float64 { return r.SteadyCPUMicrosPerMsg })
	res.SteadyAllocsPerMsg = median(runs, func(r runResult) float64 { return r.SteadyAllocsPerMsg })
	res.SteadyBytesPerMsg = median(runs, func(r runResult) float64 { return r.SteadyBytesPerMsg })
	return res, nil
}

// profiles returns where s's first run writes its CPU and allocation
// profiles ("" for none): -cpuprofile and -memprofile if s is the one
// -profile scenario; with several, each file name gets "-<slug>" before its
// extension.
func (b *bench) profiles(s Scenario) (cpu, mem string) {
	if b.o.profile == "" {
		return "", ""
	}
	scen, err := selectScenarios(b.o.profile)
	if err != nil || !slices.ContainsFunc(scen, func(p Scenario) bool { return p.Slug() == s.Slug() }) {
		return "", ""
	}
	name := func(path string) string {
		if path == "" || len(scen) == 1 {
			return path
		}
		ext := filepath.Ext(path)
		return strings.TrimSuffix(path, ext) + "-" + s.Slug() + ext
	}
	return name(b.o.cpuprofile), name(b.o.memprofile)
}

// latency produces at half of res.MsgsPerSec (capped) into a fresh topic
// once s's group has joined, and records each record's end-to-end latency.
func (b *bench) latency(ctx context.Context, s Scenario, res *scenarioResult, idx int) error {
	rate := min(res.MsgsPerSec/2, b.o.latMaxRate)
	n := int(rate * (b.o.latDuration + b.o.latWarmup).Seconds())
	if n < 10 {
		return fmt.Errorf("latency: rate %.0f msgs/s is too low", rate)
	}
	topic := fmt.Sprintf("idem-bench-lat-%s-%d", b.runID, idx)
	if err := b.k.createTopic(ctx, topic, b.o.partitions); err != nil {
		return err
	}
	defer b.k.deleteTopics([]string{topic})
	a := childArgs{scenario: s.Name, topic: topic, group: b.group(s, "lat"), limit: n, latency: true, warmup: b.o.latWarmup}
	r, err := b.child(ctx, a, func(ctx context.Context, exited <-chan struct{}) error {
		if err := b.waitJoined(ctx, a.group, exited); err != nil {
			return err
		}
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { // the child failing stops the load
			select {
			case <-exited:
				cancel()
			case <-pctx.Done():
			}
		}()
		if err := produce(pctx, topic, "lat", n, b.o.size, rate); err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	res.LatencyRate, res.LatencyRecords = rate, r.LatencyN
	res.P50ms, res.P95ms, res.P99ms = r.P50ms, r.P95ms, r.P99ms
	res.Breakdown = r.Breakdown
	logf("  %-22s latency at %.0f msgs/s: p50 %.1f ms  p95 %.1f ms  p99 %.1f ms", s.Name, rate, r.P50ms, r.P95ms, r.P99ms)
	return nil
}

// waitJoined polls the group until it is Stable with partitions assigned.
func (b *bench) waitJoined(ctx context.Context, group string, exited <-chan struct{}) error {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		ds, err := b.k.admin.DescribeConsumerGroups([]string{group})
		if err == nil && len(ds) == 1 && ds[0].State == "Stable" {
			for _, m := range ds[0].Members {
				if a, err := m.GetMemberAssignment(); err == nil && len(a.Topics) > 0 {
					return nil
				}
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("latency: the child of group %s exited before joining", group)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("latency: group %s did not join within 2 minutes", group)
}

// cleanRows deletes what the PG scenarios of this invocation wrote.
func (b *bench) cleanRows() {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	like := "idem-bench-" + b.runID + "-%"
	_, _ = conn.Exec(ctx, `DELETE FROM idem_processed WHERE consumer_group LIKE $1`, like)
	_, _ = conn.Exec(ctx, `DELETE FROM `+rowsTable+` WHERE consumer_group LIKE $1`, like)
}

func runBench(ctx context.Context, o options, scen []Scenario) error {
	start := time.Now()
	b, err := newBench(o)
	if err != nil {
		return err
	}
	defer b.close()
	rep := report{StartedAt: start.UTC(), Records: o.records, Size: o.size, Partitions: o.partitions, Runs: o.runs,
		LatencySeconds: o.latDuration.Seconds(), LatencyMaxRate: o.latMaxRate}
	rep.Machine = machine(ctx, b.k)
	rep.LoadAvg[0] = loadAvg()
	logf("machine: %d cores, %.1f GiB, Kafka %s, PostgreSQL %s", rep.Machine.Cores, float64(rep.Machine.MemoryBytes)/(1<<30), rep.Machine.Kafka, rep.Machine.Postgres)
	if rep.Topic, err = b.dataTopic(ctx, o.records); err != nil {
		return err
	}
	for i, s := range scen {
		b.pg = b.pg || s.PG
		logf("scenario %s: %d records × %d runs", s.Name, s.limit(o.records), o.runs)
		res, err := b.throughput(ctx, s, rep.Topic, o.records)
		if err == nil && !o.noLatency && !s.NoKafka { // without Kafka, no record has a latency
			err = b.latency(ctx, s, &res, i)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res.Error = err.Error()
			logf("  %s FAILED: %v", s.Name, err)
		}
		rep.Scenarios = append(rep.Scenarios, res)
	}
	rep.ratios()
	rep.WallSeconds = time.Since(start).Seconds()
	rep.LoadAvg[1] = loadAvg()
	return rep.write(o.out, true)
}

// runFlatRSS runs scen over backlogs of each size and compares peak RSS.
func runFlatRSS(ctx context.Context, o options, sizes []int, scen []Scenario) error {
	start := time.Now()
	b, err := newBench(o)
	if err != nil {
		return err
	}
	defer b.close()
	rep := report{StartedAt: start.UTC(), Size: o.size, Partitions: o.partitions, Runs: o.runs, Mode: "flat-rss"}
	rep.Machine = machine(ctx, b.k)
	rep.LoadAvg[0] = loadAvg()
	for _, n := range sizes {
		topic, err := b.dataTopic(ctx, n)
		if err != nil {
			return err
		}
		for _, s := range scen {
			b.pg = b.pg || s.PG
			s.Limit = n
			logf("flat-rss %s over %d records × %d runs", s.Name, n, o.runs)
			res, err := b.throughput(ctx, s, topic, n)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				res.Error = err.Error()
			}
			rep.Scenarios = append(rep.Scenarios, res)
		}
	}
	rep.WallSeconds = time.Since(start).Seconds()
	rep.LoadAvg[1] = loadAvg()
	return rep.write(o.out, false)
}

func median(rs []runResult, f func(runResult) float64) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

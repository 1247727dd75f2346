package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// scenarioResult is one row of the table and one entry of the JSON.
type scenarioResult struct {
	Name            string    `json:"name"`
	Slug            string    `json:"slug"`
	Records         int       `json:"records"`
	PG              bool      `json:"pg,omitempty"`
	MsgsPerSec      float64   `json:"msgs_per_sec"`
	RunsMsgsPerSec  []float64 `json:"runs_msgs_per_sec"`
	VsRawSarama     float64   `json:"vs_raw_sarama,omitempty"`
	VsRawKgo        float64   `json:"vs_raw_kgo,omitempty"`
	VsNaiveLoop     float64   `json:"vs_naive_loop,omitempty"`
	Versus          string    `json:"versus,omitempty"`
	VsVersus        float64   `json:"vs_versus,omitempty"`
	JoinSeconds     float64   `json:"join_seconds"`
	PeakRSSBytes    int64     `json:"peak_rss_bytes"`
	CPUSeconds      float64   `json:"cpu_seconds"`
	CPUMicrosPerMsg float64   `json:"cpu_us_per_msg"`
	// SteadyCPUMicrosPerMsg: CPU per record from the first record done to
	// the last (median of the runs), without the join and start-up.
	SteadyCPUMicrosPerMsg float64 `json:"steady_cpu_us_per_msg"`
	// SteadyAllocsPerMsg, SteadyBytesPerMsg: heap allocations per record
	// over the same span (median of the runs).
	SteadyAllocsPerMsg float64 `json:"steady_allocs_per_msg"`
	SteadyBytesPerMsg  float64 `json:"steady_bytes_per_msg"`
	LatencyRate        float64 `json:"latency_rate_msgs_per_sec,omitempty"`
	LatencyRecords     int     `json:"latency_records,omitempty"`
	P50ms              float64 `json:"p50_ms"`
	P95ms              float64 `json:"p95_ms"`
	P99ms              float64 `json:"p99_ms"`
	// Goal is the scenario's least ratio to Versus (Scenario.Goal), and
	// P99GoalMs its bound on the latency run's p99; 0: none.
	Goal      float64 `json:"goal,omitempty"`
	P99GoalMs float64 `json:"p99_goal_ms,omitempty"`
	// Breakdown: where the latency run's records spent their time
	// (Scenario.Breakdown).
	Breakdown *breakdown `json:"breakdown,omitempty"`
	Error     string     `json:"error,omitempty"`
}

// machineInfo describes where the numbers come from.
type machineInfo struct {
	Cores       int    `json:"cores"`
	MemoryBytes int64  `json:"memory_bytes"`
	CPU         string `json:"cpu,omitempty"`
	Kafka       string `json:"kafka"`
	Postgres    string `json:"postgres"`
	Go          string `json:"go"`
	OS          string `json:"os"`
}

type report struct {
	Mode           string      `json:"mode,omitempty"`
	StartedAt      time.Time   `json:"started_at"`
	WallSeconds    float64     `json:"wall_seconds"`
	Topic          string      `json:"topic,omitempty"`
	Records        int         `json:"records,omitempty"`
	Size           int         `json:"record_bytes"`
	Partitions     int         `json:"partitions"`
	Runs           int         `json:"runs"`
	LatencySeconds float64     `json:"latency_seconds,omitempty"`
	LatencyMaxRate float64     `json:"latency_max_rate,omitempty"`
	Machine        machineInfo `json:"machine"`
	// LoadAvg is the 1-minute load average (/proc/loadavg) when the run
	// started and when it ended: above the core count, other work shared
	// the machine and msgs/s suffer more than steady CPU µs/msg.
	LoadAvg   [2]float64       `json:"load_avg_start_end"`
	Scenarios []scenarioResult `json:"scenarios"`
	Notes     []string         `json:"notes"`
}

func machine(ctx context.Context, k *kafka) machineInfo {
	m := machineInfo{Cores: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH,
		Kafka: kafkaVersion(k), Postgres: "unknown"}
	m.MemoryBytes = procField("/proc/meminfo", "MemTotal", func(v string) int64 {
		kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		return kb * 1024
	})
	m.CPU = procString("/proc/cpuinfo", "model name")
	if url := os.Getenv("DATABASE_URL"); url != "" {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if conn, err := pgx.Connect(cctx, url); err == nil {
			_ = conn.QueryRow(cctx, "SHOW server_version").Scan(&m.Postgres)
			_ = conn.Close(cctx)
		}
	}
	return m
}

// loadAvg is the 1-minute load average, 0 if /proc/loadavg cannot be read.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	return parseLoadAvg(string(b))
}

// parseLoadAvg reads the first field of /proc/loadavg's text.
func parseLoadAvg(s string) float64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func procString(path, field string) string {
	return procField(path, field, func(v string) string { return v })
}

func procField[T any](path, field string, parse func(string) T) T {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == field && strings.TrimSpace(v) != "" {
			return parse(strings.TrimSpace(v))
		}
	}
	return zero
}

// ratios fills vs raw sarama and vs raw kgo (every row), vs the naive loop
// (PG rows) and vs the scenario's Versus.
func (r *report) ratios() {
	var naive float64
	ceilings := map[ceiling]float64{}
	byName := map[string]float64{}
	for _, s := range r.Scenarios {
		if sc, err := lookup(s.Name); err == nil && s.Error == "" {
			byName[sc.Name] = s.MsgsPerSec
			if sc.Ceiling != notCeiling {
				ceilings[sc.Ceiling] = s.MsgsPerSec
			}
			if sc.Naive {
				naive = s.MsgsPerSec
			}
		}
	}
	for i := range r.Scenarios {
		s := &r.Scenarios[i]
		if s.Error != "" {
			continue
		}
		sc, err := lookup(s.Name)
		if err != nil {
			continue
		}
		s.Goal, s.P99GoalMs = sc.Goal, ms(sc.P99Goal)
		if raw := ceilings[ceilingSarama]; raw > 0 && !sc.NoKafka {
			s.VsRawSarama = s.MsgsPerSec / raw
		}
		if raw := ceilings[ceilingKgo]; raw > 0 && !sc.NoKafka {
			s.VsRawKgo = s.MsgsPerSec / raw
		}
		if naive > 0 && s.PG {
			s.VsNaiveLoop = s.MsgsPerSec / naive
		}
		if sc.Versus != "" && byName[sc.Versus] > 0 {
			s.Versus, s.VsVersus = sc.Versus, s.MsgsPerSec/byName[sc.Versus]
		}
	}
}

// write prints the table, writes the JSON (and the chart, if chart) to dir.
func (r *report) write(dir string, chart bool) error {
	r.Notes = append(r.Notes,
		"msgs/s: steady throughput, first record done to the quota-th, median of the runs; join s apart (start of the consumer to the first record done)",
		"peak RSS and CPU s: of the run's child process (ru_maxrss, user+sys), including the join; CPU µs/msg: CPU s over the records; steady CPU µs/msg: the child's CPU from its first record done to the last, per record (no join, no start-up)",
		fmt.Sprintf("latency: record timestamp to handler done (idem, Watermill ack) or offset marked (sarama and kgo loops), records produced at half the scenario's throughput (at most %.0f msgs/s) into a fresh topic once the group has joined", r.LatencyMaxRate),
		"idem: in the latency run a record counts when the store's Process or ProcessBatch returns (its transaction committed), just before idem marks its offset",
		"steady allocs/msg: the child's heap allocations (runtime/metrics) over the steady span, per record, the client's included (sarama: about 2.9 a record)",
		"breakdown: each record's produced → committed time in phases between points seen from outside the consumer (a sarama interceptor, the KeyFunc, the store); the slowest 1 % are the records at or above the total's p99",
	)
	table := r.table()
	fmt.Print(table)
	base := filepath.Join(dir, "bench-"+r.StartedAt.Format("20060102-150405"))
	if r.Mode != "" {
		base += "-" + r.Mode
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(base+".json", b, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(base+".md", []byte(table), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nJSON: %s\ntable: %s\n", base+".json", base+".md")
	if chart {
		if err := drawChart(r, base+".png"); err != nil {
			return fmt.Errorf("chart: %w", err)
		}
		fmt.Printf("chart: %s\n", base+".png")
	}
	fmt.Printf("wall time: %.0fs\n", r.WallSeconds)
	return nil
}

// table renders the results as a Markdown table with the machine above it.
func (r *report) table() string {
	var sb strings.Builder
	m := r.Machine
	fmt.Fprintf(&sb, "\nMachine: %d cores (%s), %.1f GiB; Kafka %s; PostgreSQL %s; %s %s; load average %.2f at start, %.2f at end.\n",
		m.Cores, m.CPU, float64(m.MemoryBytes)/(1<<30), m.Kafka, m.Postgres, m.Go, m.OS, r.LoadAvg[0], r.LoadAvg[1])
	if r.Mode == "" {
		fmt.Fprintf(&sb, "Topic: %d records of %d bytes, %d partitions, LZ4, keys k0…k%d; median of %d runs; latency %.0fs per scenario.\n\n",
			r.Records, r.Size, r.Partitions, keyCount-1, r.Runs, r.LatencySeconds)
		sb.WriteString("| scenario | records | msgs/s | vs raw sarama | vs raw kgo | vs naive | vs other | p50 ms | p95 ms | p99 ms | at msgs/s | peak RSS MiB | CPU s | CPU µs/msg | steady CPU µs/msg | steady allocs/msg | join s |\n")
		sb.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	} else {
		fmt.Fprintf(&sb, "Flat RSS: records of %d bytes, %d partitions; median of %d runs.\n\n", r.Size, r.Partitions, r.Runs)
		sb.WriteString("| scenario | records | msgs/s | peak RSS MiB | CPU s | join s |\n|---|--:|--:|--:|--:|--:|\n")
	}
	for _, s := range r.Scenarios {
		if s.Error != "" {
			fmt.Fprintf(&sb, "| %s | %d | failed: %s |\n", s.Name, s.Records, strings.ReplaceAll(s.Error, "|", "/"))
			continue
		}
		if r.Mode != "" {
			fmt.Fprintf(&sb, "| %s | %s | %s | %.0f | %.1f | %.2f |\n", s.Name, thousands(float64(s.Records)),
				thousands(s.MsgsPerSec), mib(s.PeakRSSBytes), s.CPUSeconds, s.JoinSeconds)
			continue
		}
		other := "—"
		if s.Versus != "" {
			other = ratio(s.VsVersus) + " × " + s.Versus
		}
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f | %.1f | %.2f | %.2f | %.1f | %.2f |\n",
			s.Name, thousands(float64(s.Records)), thousands(s.MsgsPerSec),
			ratio(s.VsRawSarama), ratio(s.VsRawKgo), ratio(s.VsNaiveLoop), other,
			msCell(s.P50ms, s.LatencyRecords), msCell(s.P95ms, s.LatencyRecords), msCell(s.P99ms, s.LatencyRecords),
			rateCell(s.LatencyRate), mib(s.PeakRSSBytes), s.CPUSeconds, s.CPUMicrosPerMsg, s.SteadyCPUMicrosPerMsg, s.SteadyAllocsPerMsg, s.JoinSeconds)
	}
	if r.Mode == "" {
		r.costs(&sb)
	}
	return sb.String()
}

// costs renders the framework's own cost: each scenario with a goal against
// another (its ratio, and the steady CPU and allocations per record of both),
// and the latency breakdown of each Breakdown scenario.
func (r *report) costs(sb *strings.Builder) {
	byName := map[string]scenarioResult{}
	for _, s := range r.Scenarios {
		byName[s.Name] = s
	}
	first := true
	for _, s := range r.Scenarios {
		if s.Error != "" || s.Goal == 0 || s.VsVersus == 0 {
			continue
		}
		if first {
			sb.WriteString("\nThe framework's own cost: each scenario against what it replaces or stands on, in this run.\n\n")
			sb.WriteString("| scenario | against | msgs/s ratio | goal | met | steady CPU µs/msg | against's | steady allocs/msg | against's |\n")
			sb.WriteString("|---|---|--:|--:|---|--:|--:|--:|--:|\n")
			first = false
		}
		v := byName[s.Versus]
		fmt.Fprintf(sb, "| %s | %s | %s | ≥ %.2f | %s | %.2f | %.2f | %.1f | %.1f |\n", s.Name, s.Versus, ratio(s.VsVersus), s.Goal,
			yesNo(s.VsVersus >= s.Goal), s.SteadyCPUMicrosPerMsg, v.SteadyCPUMicrosPerMsg, s.SteadyAllocsPerMsg, v.SteadyAllocsPerMsg)
	}
	for _, s := range r.Scenarios {
		if s.Error != "" || s.Breakdown == nil {
			continue
		}
		b := s.Breakdown
		goal := ""
		if s.P99GoalMs > 0 {
			goal = fmt.Sprintf(" (goal < %s ms: %s)", msCell(s.P99GoalMs, 1), map[bool]string{true: "met", false: "not met"}[s.P99ms < s.P99GoalMs])
		}
		fmt.Fprintf(sb, "\nWhere the time goes: %s, latency run at %s msgs/s, p99 %s ms%s; %s records in %s batches (%.1f a batch); "+
			"the partitions' workers were in a batch %.0f %% of the time.\n\n",
			s.Name, thousands(s.LatencyRate), msCell(s.P99ms, s.LatencyRecords), goal, thousands(float64(b.Records)), thousands(float64(b.Batches)), b.MeanBatch, 100*b.Busy)
		sb.WriteString("| phase | from → to | mean ms | p50 ms | p99 ms | slowest 1 %: mean ms | share |\n|---|---|--:|--:|--:|--:|--:|\n")
		for _, p := range b.Phases {
			fmt.Fprintf(sb, "| %s | %s | %s | %s | %s | %s | %.0f %% |\n", p.Name, p.What, msCell(p.MeanMs, 1), msCell(p.P50ms, 1), msCell(p.P99ms, 1),
				msCell(p.TailMeanMs, 1), 100*p.TailShare)
		}
		if b.MarkBatches > 0 {
			fmt.Fprintf(sb, "\nThe marks after a COMMIT (bound: COMMIT returned → the partition's next record, already fetched, taken), over %s batches: p50 %s ms, p99 %s ms. "+
				"The marked offsets are committed to Kafka every CommitInterval (1 s) in the background, on no record's path.\n",
				thousands(float64(b.MarkBatches)), msCell(b.MarkP50ms, 1), msCell(b.MarkP99ms, 1))
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func ratio(v float64) string {
	switch {
	case v == 0:
		return "—"
	case v < 0.1:
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func msCell(v float64, n int) string {
	if n == 0 {
		return "—"
	}
	if v < 10 {
		return fmt.Sprintf("%.2f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func rateCell(v float64) string {
	if v == 0 {
		return "—"
	}
	return thousands(v)
}

// thousands formats v rounded, with commas: 1,820,299.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// redraw draws the chart of a JSON report again, as <report>.png.
func redraw(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var r report
	if err := json.Unmarshal(raw, &r); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	png := strings.TrimSuffix(path, ".json") + ".png"
	if err := drawChart(&r, png); err != nil {
		return err
	}
	fmt.Println("chart:", png)
	return nil
}

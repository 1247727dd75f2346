package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

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

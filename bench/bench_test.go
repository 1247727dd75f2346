package main

import (
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1820299.4: "1,820,299", 5735.6: "5,736"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestQuantile(t *testing.T) {
	var l []time.Duration
	for i := 1; i <= 100; i++ {
		l = append(l, time.Duration(i)*time.Millisecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 50 * time.Millisecond, 0.95: 95 * time.Millisecond, 0.99: 99 * time.Millisecond, 1: 100 * time.Millisecond} {
		if got := quantile(l, q); got != want {
			t.Errorf("quantile(%v) = %v, want %v", q, got, want)
		}
	}
}

func TestRegistry(t *testing.T) {
	names := map[string]bool{}
	for _, s := range registry {
		names[s.Name] = true
		if s.Consume == nil {
			t.Errorf("%s: no Consume", s.Name)
		}
		if got, err := lookup(s.Slug()); err != nil || got.Name != s.Name {
			t.Errorf("lookup(%q) = %q, %v", s.Slug(), got.Name, err)
		}
	}
	for _, s := range registry {
		if s.Versus != "" && !names[s.Versus] {
			t.Errorf("%s: Versus %q is not a scenario", s.Name, s.Versus)
		}
		if s.Goal > 0 && s.Versus == "" {
			t.Errorf("%s: a Goal with no Versus to reach it against", s.Name)
		}
		if s.NoKafka && (s.Breakdown || s.P99Goal > 0) {
			t.Errorf("%s: without Kafka there is no latency run to break down", s.Name)
		}
	}
	if _, err := lookup("no such"); err == nil {
		t.Error("lookup of an unknown name succeeded")
	}
	if got := (Scenario{Limit: pgLimit}).limit(1000); got != 1000 {
		t.Errorf("limit is capped at the topic's records: got %d", got)
	}
}

// TestMeter checks the quota cancels the run and the warm-up is left out of
// the percentiles.
func TestMeter(t *testing.T) {
	cancelled := false
	m := newMeter(4, true, time.Second, func() { cancelled = true })
	base := time.Now().Add(-10 * time.Second)
	m.Done(base)                      // warm-up: ~10 s late, left out
	m.Done(base.Add(2 * time.Second)) // ~8 s
	m.Done(base.Add(3 * time.Second)) // ~7 s
	if cancelled {
		t.Fatal("cancelled before the quota")
	}
	m.Done(base.Add(4 * time.Second)) // ~6 s
	if !cancelled {
		t.Fatal("not cancelled at the quota")
	}
	r := m.result()
	if r.Count != 4 || r.LatencyN != 3 {
		t.Fatalf("count %d, latency_n %d; want 4, 3", r.Count, r.LatencyN)
	}
	if r.P99ms < 7900 || r.P99ms > 9000 {
		t.Errorf("p99 %.0f ms, want about 8000 (the warm-up record left out)", r.P99ms)
	}
}

func TestReportTableAndChart(t *testing.T) {
	r := &report{Records: 1000, Size: 200, Partitions: 12, Runs: 1, LatencySeconds: 10, LatencyMaxRate: 25000,
		Machine: machineInfo{Cores: 2, Kafka: "4.1", Postgres: "15"}, Scenarios: []scenarioResult{
			{Name: "raw sarama", Records: 1000, MsgsPerSec: 1e6, P50ms: 1, P95ms: 2, P99ms: 3, LatencyRecords: 10, LatencyRate: 25000},
			{Name: "raw kgo", Records: 1000, MsgsPerSec: 2e6, P50ms: 1, P95ms: 2, P99ms: 3, LatencyRecords: 10, LatencyRate: 25000},
			{Name: "naive loop", Records: 100, PG: true, MsgsPerSec: 5000, P50ms: 10, P95ms: 20, P99ms: 30, LatencyRecords: 10, LatencyRate: 2500},
			{Name: "idem PG", Records: 100, PG: true, MsgsPerSec: 5500, P50ms: 11, P95ms: 21, P99ms: 31, LatencyRecords: 10, LatencyRate: 2750},
			{Name: "idem memory", Records: 1000, MsgsPerSec: 2e5},
			{Name: "idem no store", Records: 1000, MsgsPerSec: 4e5},
			{Name: "idem 2 ms", Error: "boom"},
		}}
	r.ratios()
	table := r.table()
	for _, want := range []string{"| idem PG | 100 | 5,500 | 0.005 | 0.003 | 1.10 |", "| idem memory | 1,000 | 200,000 | 0.20 | 0.10 | — |",
		"| raw sarama | 1,000 | 1,000,000 | 1.00 | 0.50 |", "2.00 × idem memory", "failed: boom"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	path := filepath.Join(t.TempDir(), "c.png")
	if err := drawChart(r, path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 900 || b.Dy() < 900 {
		t.Errorf("chart is %v, want at least 900×900", b)
	}
}

// TestOutboxReport: -outbox-rates parses, and the outbox table shows every
// rate's figures and the throughput ratio.
func TestOutboxReport(t *testing.T) {
	if _, err := parseRates("1000,x"); err == nil {
		t.Fatal("parseRates accepted x")
	}
	rates, err := parseRates("1000, 10000")
	if err != nil || len(rates) != 2 || rates[1] != 10000 {
		t.Fatalf("parseRates = %v, %v", rates, err)
	}
	r := outboxReport{Size: 200, Partitions: 12, Rows: 100000, RelayPerSec: 40000, RawProducerPerSec: 100000, RelayVsRawProducer: 0.4,
		Latency: []outboxLatency{{OfferedRate: 1000, PerCommit: 1, AchievedRate: 1000, Events: 5000, P50Ms: 2.8, P99Ms: 13}}}
	tab := r.table()
	for _, want := range []string{"| 1,000 | 1 | 1,000 | 5,000 | 2.8 | 13.0 |", "40,000 events/s", "0.40× raw"} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
}

// TestProfiles: -profile names one scenario (files as given) or several
// (each file gets the scenario's slug); others get no profile.
func TestProfiles(t *testing.T) {
	one := &bench{o: options{profile: "idem memory", cpuprofile: "out/cpu.pprof", memprofile: "out/mem.pprof"}}
	mem, _ := lookup("idem memory")
	raw, _ := lookup("raw sarama")
	if c, m := one.profiles(mem); c != "out/cpu.pprof" || m != "out/mem.pprof" {
		t.Errorf("one scenario: %q, %q", c, m)
	}
	if c, m := one.profiles(raw); c != "" || m != "" {
		t.Errorf("not profiled: %q, %q", c, m)
	}
	two := &bench{o: options{profile: "idem memory,raw-sarama", cpuprofile: "out/cpu.pprof"}}
	if c, m := two.profiles(raw); c != "out/cpu-raw-sarama.pprof" || m != "" {
		t.Errorf("two scenarios: %q, %q", c, m)
	}
}

// TestMeterSteadyCPU: the CPU spent between the first record done and the
// quota-th is reported per record, and the CPU before the first is not.
func TestMeterSteadyCPU(t *testing.T) {
	spin := func(d time.Duration) { // burn CPU, not wall time
		start := processCPU()
		for processCPU()-start < int64(d) {
		}
	}
	m := newMeter(3, false, 0, func() {})
	spin(100 * time.Millisecond) // the "join": left out
	m.Done(time.Now())
	spin(20 * time.Millisecond)
	m.Done(time.Now())
	m.Done(time.Now())
	got := m.result().SteadyCPUMicrosPerMsg // 20 ms over 2 records: about 10,000 µs each
	if got < 9_000 || got > 40_000 {
		t.Fatalf("steady CPU %.0f µs/msg, want about 10,000 (20 ms over 2 records, the 100 ms before left out)", got)
	}
}

func TestLoadAvg(t *testing.T) {
	for in, want := range map[string]float64{"2.48 2.44 2.29 3/812 12345\n": 2.48, "": 0, "x": 0} {
		if got := parseLoadAvg(in); got != want {
			t.Errorf("parseLoadAvg(%q) = %v, want %v", in, got, want)
		}
	}
}

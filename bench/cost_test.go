package main

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time         { return c.t }
func (c *fakeClock) add(d time.Duration)    { c.t = c.t.Add(d) }
func (c *fakeClock) ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func record(key string, partition int32, ts time.Time) *sarama.ConsumerMessage {
	return &sarama.ConsumerMessage{Partition: partition, Timestamp: ts,
		Headers: []*sarama.RecordHeader{{Key: []byte(idemKeyHeader), Value: []byte(key)}}}
}

// TestPhasesBreakdown drives the recorder through two batches of one
// partition with a hand-moved clock: each phase is the time between its two
// points, the phases add up to the total, the warm-up is left out, and the
// mark bound is measured only when the next record was already fetched.
func TestPhasesBreakdown(t *testing.T) {
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	p := newPhases()
	p.now = c.now
	keys := p.keyFunc(consumer.HeaderKey(idemKeyHeader))
	take := func(key string) {
		t.Helper()
		m := &handler.Message{Partition: 3, Headers: []handler.Header{{Key: idemKeyHeader, Value: []byte(key)}}}
		if k, err := keys(m); err != nil || k != key {
			t.Fatalf("KeyFunc = %q, %v", k, err)
		}
	}
	runBatch := func(keys []string, begin, handle, commit time.Duration) {
		t.Helper()
		b, fn := p.batch(func(context.Context, []int) error { c.add(handle); return nil })
		c.add(begin)
		if err := fn(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		c.add(commit)
		recs := make([]dedupe.Record, len(keys))
		for i, k := range keys {
			recs[i] = dedupe.Record{Key: k, Partition: 3}
		}
		p.committed(b, recs)
	}

	// Batch 1, the warm-up: a, produced at 0, fetched at 2 ms, taken at 3.
	t0 := c.t
	c.add(c.ms(2))
	p.OnConsume(record("a", 3, t0))
	c.add(c.ms(1))
	take("a")
	// b and c are produced at 10 ms and fetched at 12, while a's batch runs
	// (begin 1, handler 5, COMMIT 2: it commits at 11 ms + 8 = 19).
	c.add(c.ms(8)) // 11 ms
	c.add(c.ms(1))
	p.OnConsume(record("b", 3, t0.Add(c.ms(10))))
	p.OnConsume(record("c", 3, t0.Add(c.ms(10))))
	c.add(-c.ms(1)) // back to 11 ms: the batch of a starts
	runBatch([]string{"a"}, c.ms(1), c.ms(5), c.ms(2))
	// b is taken 1 ms after a's COMMIT (the marks), c 0.5 ms later (gather).
	c.add(c.ms(1)) // 20 ms
	take("b")
	c.add(c.ms(1) / 2)
	take("c")
	runBatch([]string{"b", "c"}, c.ms(2), c.ms(10), c.ms(4)) // commits at 36.5 ms

	b := p.result(5 * time.Millisecond) // a (produced at 0) is the warm-up
	if b == nil {
		t.Fatal("no breakdown")
	}
	if b.Records != 2 || b.Batches != 1 || b.MeanBatch != 2 {
		t.Fatalf("records %d, batches %d, mean %.1f; want 2, 1, 2", b.Records, b.Batches, b.MeanBatch)
	}
	got := map[string]phaseStat{}
	for _, s := range b.Phases {
		got[s.Name] = s
	}
	// b and c: kafka 2 ms, queue 8 and 8.5 ms, gather 0.5 and 0, begin 2,
	// handler 10, commit 4, total 26.5 ms.
	for name, want := range map[string]float64{"kafka": 2, "queue": 8.5, "gather": 0.5, "begin": 2, "handler": 10, "commit": 4, "total": 26.5} {
		if s, ok := got[name]; !ok || math.Abs(s.P99ms-want) > 1e-9 {
			t.Errorf("%s: p99 %.3f ms, want %.3f (%+v)", name, s.P99ms, want, s)
		}
	}
	if s := got["queue"]; math.Abs(s.MeanMs-8.25) > 1e-9 {
		t.Errorf("queue: mean %.3f ms, want 8.25", s.MeanMs)
	}
	var shares float64
	for _, s := range b.Phases {
		if s.Name != "total" && s.Name != "own" {
			shares += s.TailShare
		}
	}
	if math.Abs(shares-1) > 1e-9 || got["total"].TailShare != 1 {
		t.Errorf("the phases' shares add up to %.6f, total's is %.6f; want 1 and 1", shares, got["total"].TailShare)
	}
	if b.MarkBatches != 1 || b.MarkP99ms != 1 {
		t.Errorf("mark bound over %d batches, p99 %.3f ms; want 1 batch (b was waiting when a committed; c's batch has no successor), 1 ms", b.MarkBatches, b.MarkP99ms)
	}
	if b.Busy != 1 { // only b and c's batch counts: 20.5 ms to 36.5, all of it in the batch
		t.Errorf("busy %.4f, want 1", b.Busy)
	}
	// Without a warm-up both batches count: the worker was in one 8 + 16 ms
	// of the 25.5 from 11 ms to 36.5.
	if all := p.result(0); all == nil || all.Records != 3 || math.Abs(all.Busy-24.0/25.5) > 1e-9 {
		t.Errorf("without warm-up: %+v, want 3 records and busy %.4f", all, 24.0/25.5)
	}
}

// TestPhasesMarkNeedsWaitingRecord: a record fetched after the COMMIT
// proves nothing about the marks (the worker waited for it), so no bound.
func TestPhasesMarkNeedsWaitingRecord(t *testing.T) {
	c := &fakeClock{t: time.Unix(1_800_000_000, 0)}
	p := newPhases()
	p.now = c.now
	b, fn := p.batch(func(context.Context, []int) error { return nil })
	_ = fn(context.Background(), nil)
	p.committed(b, []dedupe.Record{{Key: "x", Partition: 0}})
	c.add(50 * time.Millisecond)
	p.OnConsume(record("y", 0, c.t))
	p.taken("y", 0)
	if len(p.marks) != 0 {
		t.Fatalf("marks %v, want none", p.marks)
	}
}

func TestHeaderKey(t *testing.T) {
	m := &sarama.ConsumerMessage{Headers: []*sarama.RecordHeader{
		{Key: []byte(idemKeyHeader), Value: []byte("first")}, nil, {Key: []byte("other"), Value: []byte("x")},
		{Key: []byte(idemKeyHeader), Value: []byte("last")}, nil}}
	if got := headerKey(m); got != "last" {
		t.Errorf("headerKey = %q, want the last one, as consumer.HeaderKey", got)
	}
	if got := headerKey(&sarama.ConsumerMessage{}); got != "" {
		t.Errorf("headerKey of no headers = %q", got)
	}
}

// TestReportCosts: the cost section gives each goal's ratio with both
// scenarios' CPU and allocations, and the breakdown; a scenario without
// Kafka gets no ratio to the Kafka ceilings.
func TestReportCosts(t *testing.T) {
	r := &report{Records: 1000, Size: 200, Partitions: 12, Runs: 1, Machine: machineInfo{Cores: 2}, Scenarios: []scenarioResult{
		{Name: "raw sarama", Records: 1000, MsgsPerSec: 1e6},
		{Name: "hand-written dedupe loop", Records: 1000, MsgsPerSec: 4e5, SteadyCPUMicrosPerMsg: 2.5, SteadyAllocsPerMsg: 3.9},
		{Name: "idem memory", Records: 1000, MsgsPerSec: 2e5, SteadyCPUMicrosPerMsg: 3.7, SteadyAllocsPerMsg: 4.9},
		{Name: "idem PG batched", Records: 100, PG: true, MsgsPerSec: 20000, P99ms: 145, LatencyRecords: 10, LatencyRate: 10000,
			Breakdown: &breakdown{Records: 10, Batches: 2, MeanBatch: 5, Busy: 0.6, MarkBatches: 2, MarkP50ms: 0.03, MarkP99ms: 0.4,
				Phases: []phaseStat{{Name: "queue", What: "fetched → taken", MeanMs: 40, P50ms: 20, P99ms: 330, TailMeanMs: 390, TailShare: 0.9}}}},
		{Name: "idem PG batch handler", Records: 100, PG: true, MsgsPerSec: 60000, SteadyCPUMicrosPerMsg: 5.3},
		{Name: "PostgreSQL alone", Records: 100, PG: true, MsgsPerSec: 50000, SteadyCPUMicrosPerMsg: 3},
	}}
	r.ratios()
	tab := r.table()
	for _, want := range []string{
		"| idem memory | hand-written dedupe loop | 0.50 | ≥ 1.00 | no | 3.70 | 2.50 | 4.9 | 3.9 |",
		"| idem PG batch handler | PostgreSQL alone | 1.20 | ≥ 0.50 | yes | 5.30 | 3.00 |",
		"| PostgreSQL alone | 100 | 50,000 | — | — |",
		"idem PG batched, latency run at 10,000 msgs/s, p99 145 ms (goal < 100 ms: not met)",
		"workers were in a batch 60 % of the time",
		"| queue | fetched → taken | 40 | 20 | 330 | 390 | 90 % |",
		"over 2 batches: p50 0.03 ms, p99 0.40 ms",
	} {
		if !strings.Contains(tab, want) {
			t.Errorf("table lacks %q:\n%s", want, tab)
		}
	}
}

// TestMeterSteadyAllocs: the allocations between the first record done and
// the quota-th are reported per record.
func TestMeterSteadyAllocs(t *testing.T) {
	m := newMeter(3, false, 0, func() {})
	m.Done(time.Now())
	for range 20_000 { // 10,000 per record over the 2 after the first
		allocSink = make([]byte, 64)
	}
	m.Done(time.Now())
	m.Done(time.Now())
	r := m.result()
	// The runtime counts small objects by the span as a P takes one (and
	// gives back what it did not use), so a count read at any moment is
	// off by up to a span per size class: within 10 % here, nothing over a
	// million records.
	if r.SteadyAllocsPerMsg < 9_000 || r.SteadyAllocsPerMsg > 11_000 {
		t.Errorf("steady allocs %.0f a record, want about 10,000", r.SteadyAllocsPerMsg)
	}
	if r.SteadyBytesPerMsg < 576_000 || r.SteadyBytesPerMsg > 720_000 {
		t.Errorf("steady bytes %.0f a record, want about 640,000", r.SteadyBytesPerMsg)
	}
}

var allocSink []byte

// BenchmarkPhasesRecord is what the breakdown adds to one record of a
// batch of 100 (fetched, taken, its own statement, its batch's share):
//
//	cd bench && go test -run '^$' -bench PhasesRecord -benchmem
func BenchmarkPhasesRecord(b *testing.B) {
	p := newPhases()
	const batch = 100
	msgs := make([]*sarama.ConsumerMessage, b.N)
	keys := make([]string, b.N)
	for i := range msgs {
		keys[i] = "lat-" + strconv.Itoa(i) // the latency load's keys
		msgs[i] = record(keys[i], int32(i%12), time.Now())
	}
	fn := func(context.Context, []int) error { return nil }
	recs := make([]dedupe.Record, 0, batch)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		p.OnConsume(msgs[i])
		p.taken(keys[i], int32(i%12))
		now := time.Now()
		p.own(keys[i], now, now)
		recs = append(recs, dedupe.Record{Key: keys[i], Partition: int32(i % 12)})
		if len(recs) == batch || i == b.N-1 {
			bt, f := p.batch(fn)
			_ = f(context.Background(), nil)
			p.committed(bt, recs)
			recs = recs[:0]
		}
	}
}

package main

import (
	"cmp"
	"context"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Meter counts finished records, times the first and the quota-th, and in
// latency mode keeps each record's end-to-end latency. It cancels the run
// when the quota is reached. Safe for concurrent use.
type Meter struct {
	quota   int64
	cancel  context.CancelFunc
	start   time.Time
	latency bool

	n     atomic.Int64
	first atomic.Int64 // unix ns of the first Done
	last  atomic.Int64 // unix ns of the quota-th Done
	// CPU time of the process (user + sys, ns) at the first and the
	// quota-th Done: the steady phase's CPU, without the join's.
	cpuFirst, cpuLast atomic.Int64
	// Heap allocations of the process (count, bytes) at the same two
	// points: the steady phase's allocations per record.
	allocFirst, allocLast atomic.Pointer[heapAllocs]

	warmup time.Duration // latencies of records stamped this soon after the first are left out

	mu   sync.Mutex
	lats []latency
}

type latency struct {
	ts int64 // record timestamp, unix ns
	d  time.Duration
}

func newMeter(quota int, lat bool, warmup time.Duration, cancel context.CancelFunc) *Meter {
	m := &Meter{quota: int64(quota), cancel: cancel, start: time.Now(), latency: lat, warmup: warmup}
	if lat {
		m.lats = make([]latency, 0, quota)
	}
	return m
}

// Done reports one record finished; ts is its Kafka timestamp.
func (m *Meter) Done(ts time.Time) {
	if m.latency {
		l := latency{ts: ts.UnixNano(), d: time.Since(ts)}
		m.mu.Lock()
		m.lats = append(m.lats, l)
		m.mu.Unlock()
	}
	switch n := m.n.Add(1); n {
	case 1:
		m.first.CompareAndSwap(0, time.Now().UnixNano())
		m.cpuFirst.Store(processCPU())
		m.allocFirst.Store(readHeapAllocs())
		if m.quota == 1 {
			m.finish()
		}
	case m.quota:
		m.finish()
	}
}

func (m *Meter) finish() {
	m.last.Store(time.Now().UnixNano())
	m.cpuLast.Store(processCPU())
	m.allocLast.Store(readHeapAllocs())
	m.cancel()
}

// heapAllocs is the process's heap allocations so far.
type heapAllocs struct {
	objects, bytes uint64
}

// heapAllocNames are the runtime/metrics samples readHeapAllocs reads:
// objects (tiny ones apart: the runtime counts the blocks they are packed
// into under allocs:objects, each tiny allocation under tiny/allocs, so
// their sum is MemStats.Mallocs, what `go test -benchmem` reports) and
// bytes.
var heapAllocNames = []string{"/gc/heap/allocs:objects", "/gc/heap/tiny/allocs:objects", "/gc/heap/allocs:bytes"}

// readHeapAllocs reads the allocation counters without stopping the world
// (runtime.ReadMemStats would).
func readHeapAllocs() *heapAllocs {
	s := make([]metrics.Sample, len(heapAllocNames))
	for i, n := range heapAllocNames {
		s[i].Name = n
	}
	metrics.Read(s)
	v := func(i int) uint64 {
		if s[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[i].Value.Uint64()
	}
	return &heapAllocs{objects: v(0) + v(1), bytes: v(2)}
}

// processCPU is this process's CPU time so far (user + sys, every thread),
// in ns; 0 if it cannot be read.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// result summarises the run.
func (m *Meter) result() childResult {
	r := childResult{Count: m.n.Load()}
	first, last := m.first.Load(), m.last.Load()
	if first != 0 {
		r.JoinSeconds = time.Unix(0, first).Sub(m.start).Seconds()
	}
	if first != 0 && last != 0 {
		r.SteadySeconds = time.Duration(last - first).Seconds()
		if r.SteadySeconds > 0 {
			r.MsgsPerSec = float64(m.quota-1) / r.SteadySeconds
		}
		if c0, c1 := m.cpuFirst.Load(), m.cpuLast.Load(); c0 > 0 && c1 >= c0 && m.quota > 1 {
			r.SteadyCPUMicrosPerMsg = float64(c1-c0) / 1e3 / float64(m.quota-1)
		}
		if a0, a1 := m.allocFirst.Load(), m.allocLast.Load(); a0 != nil && a1 != nil && a1.objects >= a0.objects && m.quota > 1 {
			r.SteadyAllocsPerMsg = float64(a1.objects-a0.objects) / float64(m.quota-1)
			r.SteadyBytesPerMsg = float64(a1.bytes-a0.bytes) / float64(m.quota-1)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.lats) > 0 {
		from := slices.MinFunc(m.lats, func(a, b latency) int { return cmp.Compare(a.ts, b.ts) }).ts + int64(m.warmup)
		var l []time.Duration
		for _, x := range m.lats {
			if x.ts >= from {
				l = append(l, x.d)
			}
		}
		slices.Sort(l)
		r.LatencyN = len(l)
		if len(l) == 0 {
			return r
		}
		r.P50ms = ms(quantile(l, 0.50))
		r.P95ms = ms(quantile(l, 0.95))
		r.P99ms = ms(quantile(l, 0.99))
	}
	return r
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

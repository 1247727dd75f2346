package adaptive

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"time"
)

// dependency is a simulated dependency: a call that starts with k calls in
// flight (itself included) takes base × shape(k/n) × (1 ± 5 %), where shape is
// 1 up to k = n and rises past it. With quota > 0, a call that starts with
// more than quota in flight is answered 429 at once (a tenth of base).
type dependency struct {
	n     int
	base  time.Duration
	shape func(x float64) float64 // x = k/n > 1
	quota int
}

// linear: latency grows with the calls past n (a queue in front of n
// workers): throughput stays at its best past n, latency does not.
func linear(x float64) float64 { return x }

// quadratic: contention (locks, thrashing): throughput falls past n.
func quadratic(x float64) float64 { return x * x }

func (d *dependency) call(k int, r *rand.Rand) (time.Duration, bool) {
	if d.quota > 0 && k > d.quota {
		return d.base / 10, true
	}
	f := 1.0
	if k > d.n {
		f = d.shape(float64(k) / float64(d.n))
	}
	noise := 0.95 + 0.1*r.Float64()
	return time.Duration(float64(d.base) * f * noise), false
}

// controller is what the simulation drives: the Limiter, or a fixed limit.
type controller interface {
	Limit() int
	Observe(Sample)
}

type fixed int

func (f fixed) Limit() int     { return int(f) }
func (f fixed) Observe(Sample) {}

// sim is a discrete-event simulation on a virtual clock: each caller keeps
// as many calls in flight as its controller's limit allows (and as it has
// work for: demand, 0 = unbounded); each call ends after the dependency's
// latency, which depends on the calls in flight of all callers, and its
// sample goes to its caller's controller. Nothing sleeps; the same seed gives
// the same run.
type sim struct {
	cs     []controller
	dep    *dependency
	demand int
	rnd    *rand.Rand

	now      time.Duration
	inFlight []int // per caller
	total    int   // calls in flight, all callers
	seq      int
	pending  events
	done     int
	limits   []int     // the limit of caller 0 after each completed call
	means    []float64 // per caller: the sum of its limits after each completed call
}

type event struct {
	caller    int
	at        time.Duration
	seq       int
	latency   time.Duration
	inFlight  int
	throttled bool
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

func newSim(c controller, dep *dependency, seed uint64) *sim {
	return newMultiSim(dep, seed, c)
}

func newMultiSim(dep *dependency, seed uint64, cs ...controller) *sim {
	return &sim{cs: cs, dep: dep, rnd: rand.New(rand.NewPCG(seed, 7)), inFlight: make([]int, len(cs)), means: make([]float64, len(cs))}
}

// fill starts calls up to each caller's limit (and the demand).
func (s *sim) fill() {
	for i, c := range s.cs {
		for s.inFlight[i] < c.Limit() && (s.demand == 0 || s.inFlight[i] < s.demand) {
			s.inFlight[i]++
			s.total++
			lat, thr := s.dep.call(s.total, s.rnd)
			s.seq++
			heap.Push(&s.pending, event{caller: i, at: s.now + lat, seq: s.seq, latency: lat, inFlight: s.inFlight[i], throttled: thr})
		}
	}
}

// run completes calls more calls.
func (s *sim) run(calls int) {
	for i := 0; i < calls; i++ {
		s.fill()
		e := heap.Pop(&s.pending).(event)
		s.now = e.at
		s.inFlight[e.caller]--
		s.total--
		s.cs[e.caller].Observe(Sample{Latency: e.latency, InFlight: e.inFlight, Throttled: e.throttled})
		s.done++
		s.limits = append(s.limits, s.cs[0].Limit())
		for j, c := range s.cs {
			s.means[j] += float64(c.Limit())
		}
	}
}

// throughput returns calls completed per virtual second so far.
func (s *sim) throughput() float64 { return float64(s.done) / s.now.Seconds() }

// span returns the lowest, highest and mean limit over the last n calls.
func (s *sim) span(n int) (lo, hi int, mean float64) {
	lo, hi = math.MaxInt, 0
	sum := 0
	for _, l := range s.limits[len(s.limits)-n:] {
		lo, hi, sum = min(lo, l), max(hi, l), sum+l
	}
	return lo, hi, float64(sum) / float64(n)
}

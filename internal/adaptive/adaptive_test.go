package adaptive

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func newLimiter(tb testing.TB, cfg Config) *Limiter {
	tb.Helper()
	l, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return l
}

// within reports whether x is within ±25 % of n.
func within(x float64, n int) bool { return x >= 0.75*float64(n) && x <= 1.25*float64(n) }

// TestSettlesNearN: with a dependency whose latency rises past N concurrent
// calls, the limit settles near N (every value over the second half of the
// run within ±25 %), and the throughput is at least 80 % of the best fixed
// limit found by a sweep of 1…3N on the same dependency.
func TestSettlesNearN(t *testing.T) {
	for _, shape := range []struct {
		name string
		f    func(float64) float64
	}{{"linear", linear}, {"quadratic", quadratic}} {
		for _, n := range []int{4, 16, 64} {
			t.Run(fmt.Sprintf("%s/N=%d", shape.name, n), func(t *testing.T) {
				dep := &dependency{n: n, base: 20 * time.Millisecond, shape: shape.f}
				calls := 400 * n
				s := newSim(newLimiter(t, Config{Max: 1024}), dep, 1)
				s.run(calls)
				lo, hi, mean := s.span(calls / 2)
				t.Logf("limit over the second half: %d…%d, mean %.1f (N = %d)", lo, hi, mean, n)
				if !within(float64(lo), n) || !within(float64(hi), n) {
					t.Fatalf("limit moved within %d…%d over the second half, want within ±25%% of %d", lo, hi, n)
				}

				best, bestAt := 0.0, 0
				for f := 1; f <= 3*n; f++ {
					fs := newSim(fixed(f), dep, 1)
					fs.run(calls / 4)
					if tp := fs.throughput(); tp > best {
						best, bestAt = tp, f
					}
				}
				// The adaptive run's throughput over its second half.
				half := newSim(newLimiter(t, Config{Max: 1024}), dep, 1)
				half.run(calls / 2)
				start, done := half.now, half.done
				half.run(calls / 2)
				tp := float64(half.done-done) / (half.now - start).Seconds()
				t.Logf("throughput %.0f/s, best fixed %.0f/s at %d", tp, best, bestAt)
				if tp < 0.8*best {
					t.Fatalf("throughput %.0f/s is under 80%% of the best fixed limit's %.0f/s (limit %d)", tp, best, bestAt)
				}
			})
		}
	}
}

// TestShrinksOn429AndGrowsBack: the dependency's quota drops to a third of N
// (calls past it are answered 429): the limit falls to the quota; when the
// quota is lifted and the latency holds, it grows back near N.
func TestShrinksOn429AndGrowsBack(t *testing.T) {
	const n = 30
	dep := &dependency{n: n, base: 20 * time.Millisecond, shape: linear}
	l := newLimiter(t, Config{Min: 2, Max: 256})
	s := newSim(l, dep, 3)
	s.run(200 * n)
	if _, _, mean := s.span(50 * n); !within(mean, n) {
		t.Fatalf("before the quota: mean limit %.1f, want near %d", mean, n)
	}

	dep.quota = n / 3
	s.run(100 * n)
	lo, hi, mean := s.span(50 * n)
	t.Logf("under a quota of %d: limit %d…%d, mean %.1f", dep.quota, lo, hi, mean)
	if hi > dep.quota+1 || lo < 2 {
		t.Fatalf("under a quota of %d the limit moved within %d…%d, want at most %d and at least Min", dep.quota, lo, hi, dep.quota+1)
	}

	dep.quota = 0
	s.run(300 * n)
	lo, hi, mean = s.span(100 * n)
	t.Logf("quota lifted: limit %d…%d, mean %.1f", lo, hi, mean)
	if !within(float64(lo), n) || !within(float64(hi), n) {
		t.Fatalf("after the quota the limit moved within %d…%d, want back within ±25%% of %d", lo, hi, n)
	}
}

// TestFairShare: two members, each with its own controller, share one
// dependency that takes N calls at once; one starts at N, the other at 1.
// AIMD brings them to about half each (the reason it was chosen), and
// together near N.
func TestFairShare(t *testing.T) {
	const n = 40
	dep := &dependency{n: n, base: 20 * time.Millisecond, shape: linear}
	a, b := newLimiter(t, Config{Max: 256, Initial: n}), newLimiter(t, Config{Max: 256})
	s := newMultiSim(dep, 13, a, b)
	s.run(1000 * n)
	s.means = []float64{0, 0}
	const calls = 1000 * n
	s.run(calls)
	ma, mb := s.means[0]/calls, s.means[1]/calls
	t.Logf("mean limits over the second half: %.1f and %.1f (N = %d)", ma, mb, n)
	if ma < 0.35*n || mb < 0.35*n {
		t.Fatalf("mean limits %.1f and %.1f: one member starves the other (want each at least 35%% of %d)", ma, mb, n)
	}
	if !within(ma+mb, n) {
		t.Fatalf("together %.1f, want within ±25%% of %d", ma+mb, n)
	}
}

// TestOne429CutsOnce: the 429s of the calls that were in flight together
// cut the limit once, not once each.
func TestOne429CutsOnce(t *testing.T) {
	l := newLimiter(t, Config{Max: 100, Initial: 50})
	for i := 0; i < 50; i++ {
		l.Observe(Sample{Latency: time.Millisecond, InFlight: 50, Throttled: true})
	}
	if got := l.Limit(); got != 42 {
		t.Fatalf("limit after 50 429s of one round = %d, want 42 (one cut by 0.85)", got)
	}
	l.Observe(Sample{Latency: time.Millisecond, InFlight: 42, Throttled: true}) // the next round
	if got := l.Limit(); got != 35 {
		t.Fatalf("limit after a 429 of the next round = %d, want 35", got)
	}
}

// TestAppLimited: a caller with less work than lanes gets no more lanes.
func TestAppLimited(t *testing.T) {
	dep := &dependency{n: 64, base: 10 * time.Millisecond, shape: linear}
	s := newSim(newLimiter(t, Config{Max: 512}), dep, 5)
	s.demand = 5
	s.run(20000)
	if _, hi, _ := s.span(20000); hi > 8 {
		t.Fatalf("with work for 5 calls at once the limit reached %d; want at most 8 (slow start may double 4)", hi)
	}
}

// TestBounds: the limit never leaves Min…Max, whatever the dependency does.
func TestBounds(t *testing.T) {
	dep := &dependency{n: 200, base: 10 * time.Millisecond, shape: linear}
	s := newSim(newLimiter(t, Config{Min: 3, Max: 12}), dep, 9)
	s.run(5000)
	if lo, hi, _ := s.span(2500); lo != 12 || hi != 12 {
		t.Fatalf("a dependency that takes 200 calls: limit %d…%d, want Max (12) throughout", lo, hi)
	}
	dep.quota = 1 // everything past one call is refused
	s.run(5000)
	if lo, hi, _ := s.span(4000); lo != 3 || hi != 3 {
		t.Fatalf("a quota of 1: limit %d…%d, want Min (3) throughout", lo, hi)
	}
}

// TestNewBaseline: a dependency that becomes slower for good first drives the
// limit down, then, once the old windows are out of the baseline, the limit
// grows back to its concurrency.
func TestNewBaseline(t *testing.T) {
	const n = 16
	dep := &dependency{n: n, base: 10 * time.Millisecond, shape: linear}
	s := newSim(newLimiter(t, Config{Max: 256}), dep, 11)
	s.run(200 * n)
	dep.base *= 3
	s.run(20 * n)
	lo, _, _ := s.span(20 * n)
	if lo >= n/2 {
		t.Fatalf("latency tripled: the limit kept %d or more, want a fall", lo)
	}
	s.run(400 * n)
	lo, hi, mean := s.span(100 * n)
	t.Logf("new baseline: limit %d…%d, mean %.1f", lo, hi, mean)
	if !within(float64(lo), n) || !within(float64(hi), n) {
		t.Fatalf("with the new baseline the limit moved within %d…%d, want within ±25%% of %d", lo, hi, n)
	}
}

// TestDeterministic: the controller has no clock: the same samples give the
// same limits.
func TestDeterministic(t *testing.T) {
	run := func() []int {
		s := newSim(newLimiter(t, Config{Max: 128}), &dependency{n: 20, base: 5 * time.Millisecond, shape: quadratic}, 42)
		s.run(5000)
		return s.limits
	}
	if a, b := run(), run(); !slices.Equal(a, b) {
		t.Fatal("two runs of the same samples gave different limits")
	}
}

func TestDefaults(t *testing.T) {
	l := newLimiter(t, Config{Max: 8})
	if l.cfg != (Config{Min: 1, Max: 8, Initial: 1, Tolerance: 1.1, Backoff: 0.85, Window: 10, BaselineWindows: 50}) {
		t.Fatalf("defaults applied: %+v", l.cfg)
	}
	if l.Limit() != 1 {
		t.Fatalf("initial limit %d, want Min", l.Limit())
	}
	if got := newLimiter(t, Config{Min: 2, Max: 8, Initial: 5}).Limit(); got != 5 {
		t.Fatalf("initial limit %d, want Initial 5", got)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"no max", Config{}, []string{"Max = 0, must be >= Min (1)"}},
		{"min negative", Config{Min: -1, Max: 4}, []string{"Min = -1, must be >= 1"}},
		{"max below min", Config{Min: 8, Max: 4}, []string{"Max = 4, must be >= Min (8)"}},
		{"initial above max", Config{Max: 4, Initial: 5}, []string{"Initial = 5, must be in Min…Max (1…4)"}},
		{"initial below min", Config{Min: 2, Max: 4, Initial: 1}, []string{"Initial = 1, must be in Min…Max (2…4)"}},
		{"tolerance 1", Config{Max: 4, Tolerance: 1}, []string{"Tolerance = 1, must be a finite number > 1"}},
		{"tolerance NaN", Config{Max: 4, Tolerance: math.NaN()}, []string{"Tolerance = NaN"}},
		{"tolerance Inf", Config{Max: 4, Tolerance: math.Inf(1)}, []string{"Tolerance = +Inf"}},
		{"backoff 1", Config{Max: 4, Backoff: 1}, []string{"Backoff = 1, must be in (0, 1)"}},
		{"backoff negative", Config{Max: 4, Backoff: -0.5}, []string{"Backoff = -0.5, must be in (0, 1)"}},
		{"backoff × tolerance", Config{Max: 4, Backoff: 0.9, Tolerance: 1.2}, []string{"Backoff = 0.9, × Tolerance (1.2) must be < 1"}},
		{"default backoff × tolerance", Config{Max: 4, Tolerance: 1.2}, []string{"Backoff = 0.85, × Tolerance (1.2) must be < 1"}},
		{"window", Config{Max: 4, Window: -1}, []string{"Window = -1, must be >= 1"}},
		{"baseline windows", Config{Max: 4, BaselineWindows: -2}, []string{"BaselineWindows = -2, must be >= 1"}},
		{"all at once", Config{Min: -1, Max: -2, Window: -1}, []string{"Min = -1", "Max = -2", "Window = -1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not say %q:\n%v", w, err)
				}
			}
			if l, err2 := New(tt.cfg); l != nil || err2 == nil {
				t.Fatalf("New = %v, %v; want the error", l, err2)
			}
		})
	}
}

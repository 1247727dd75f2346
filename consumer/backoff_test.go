package consumer

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestFullJitter checks fullJitter as a distribution, not by one sample: for
// each retry n the delays must cover [0, min(cap, base*2^(n-1))] uniformly.
// The generator has a fixed seed, so the test is deterministic.
func TestFullJitter(t *testing.T) {
	const (
		base    = 100 * time.Millisecond
		cap     = 5 * time.Second
		samples = 20000
		buckets = 10
		// chi-square critical value for 9 degrees of freedom at p = 0.001.
		chi2Crit = 27.877
	)
	// Kolmogorov–Smirnov critical value at alpha = 0.001: 1.95/sqrt(n).
	ksCrit := 1.95 / math.Sqrt(samples)
	r := rand.New(rand.NewPCG(1, 2))
	wantCeil := []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000} // ms, n = 1…8
	for i, ceilMS := range wantCeil {
		n := i + 1
		ceil := ceilMS * time.Millisecond
		xs := make([]float64, samples)
		var sum float64
		var counts [buckets]int
		var top time.Duration
		for j := range samples {
			d := fullJitter(base, cap, n, r)
			if d < 0 || d > ceil {
				t.Fatalf("n=%d: fullJitter = %v, outside [0, %v]", n, d, ceil)
			}
			top = max(top, d)
			u := float64(d) / float64(ceil) // in [0, 1]
			xs[j] = u
			sum += u
			counts[min(int(u*buckets), buckets-1)]++
		}
		// Mean: uniform on [0, ceil] has mean ceil/2; 3% is ~7 standard errors.
		if mean := sum / samples; math.Abs(mean-0.5) > 0.03*0.5 {
			t.Errorf("n=%d: mean = %.4f×ceil, want 0.5×ceil ±3%%", n, mean)
		}
		// The whole window is used: the top sample is close to the ceiling.
		if top < ceil*99/100 {
			t.Errorf("n=%d: largest of %d samples is %v; the window [0, %v] is not covered", n, samples, top, ceil)
		}
		// Chi-square over equal-width buckets.
		var chi2 float64
		exp := float64(samples) / buckets
		for _, c := range counts {
			chi2 += (float64(c) - exp) * (float64(c) - exp) / exp
		}
		if chi2 > chi2Crit {
			t.Errorf("n=%d: chi-square = %.2f over %d buckets %v, want <= %.2f (not uniform)", n, chi2, buckets, counts, chi2Crit)
		}
		// Kolmogorov–Smirnov against U(0, 1).
		slices.Sort(xs)
		var ks float64
		for j, x := range xs {
			ks = max(ks, math.Abs(float64(j+1)/samples-x), math.Abs(x-float64(j)/samples))
		}
		if ks > ksCrit {
			t.Errorf("n=%d: KS statistic = %.4f, want <= %.4f (not uniform)", n, ks, ksCrit)
		}
	}
}

// TestFullJitterLargeN: for n far beyond the in-process retries anyone
// configures, base*2^(n-1) must not overflow into a wrong window or a panic;
// the cap holds.
func TestFullJitterLargeN(t *testing.T) {
	const base, cap = 100 * time.Millisecond, 5 * time.Second
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{30, 37, 38, 40, 61, 62, 63, 64, 65, 100, 1000, math.MaxInt32, math.MaxInt} {
		var sum float64
		const samples = 4000
		for range samples {
			d := fullJitter(base, cap, n, r)
			if d < 0 || d > cap {
				t.Fatalf("n=%d: fullJitter = %v, outside [0, %v]", n, d, cap)
			}
			sum += float64(d)
		}
		// The window is the cap itself: mean ≈ cap/2.
		if mean := time.Duration(sum / samples); mean < cap*45/100 || mean > cap*55/100 {
			t.Errorf("n=%d: mean = %v, want about %v (window capped at %v)", n, mean, cap/2, cap)
		}
	}
}

// TestFullJitterOverflow covers base/cap pairs where base<<(n-1)
// wraps around int64 to a small positive number.
func TestFullJitterOverflow(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	cases := []struct {
		base, cap time.Duration
		n         int
	}{
		{1<<24 + 1, time.Hour, 41},
		{3, time.Duration(math.MaxInt64), 62},
		{100 * time.Millisecond, time.Duration(math.MaxInt64), 40},
	}
	for _, c := range cases {
		var top time.Duration
		for range 2000 {
			d := fullJitter(c.base, c.cap, c.n, r)
			if d < 0 || d > c.cap {
				t.Fatalf("fullJitter(%v, %v, %d) = %v, outside [0, cap]", c.base, c.cap, c.n, d)
			}
			top = max(top, d)
		}
		if top < c.cap/2 {
			t.Errorf("fullJitter(%v, %v, %d): largest of 2000 samples %v; the window should be the cap", c.base, c.cap, c.n, top)
		}
	}
}

func TestFullJitterDegenerate(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	tests := []struct {
		name      string
		base, cap time.Duration
		n         int
	}{
		{"zero base", 0, time.Second, 1},
		{"zero base, large n", 0, time.Second, 100},
		{"negative base", -time.Second, time.Second, 3},
		{"n = 0", time.Second, time.Minute, 0},
		{"negative n", time.Second, time.Minute, -5},
		{"zero cap", time.Second, 0, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 100 {
				if d := fullJitter(tt.base, tt.cap, tt.n, r); d != 0 {
					t.Fatalf("fullJitter(%v, %v, %d) = %v, want 0", tt.base, tt.cap, tt.n, d)
				}
			}
		})
	}
}

// promptly fails the test unless f returns within a generous deadline; it
// bounds a hang, it does not time anything.
func promptly(t *testing.T, what string, f func() bool) bool {
	t.Helper()
	done := make(chan bool, 1)
	go func() { done <- f() }()
	select {
	case v := <-done:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return", what)
		return false
	}
}

func TestSleep(t *testing.T) {
	t.Run("cancelled before", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		// (A tiny positive d may already have elapsed when sleep selects, and
		// then either answer is possible.)
		for _, d := range []time.Duration{-time.Second, 0, time.Hour} {
			if promptly(t, "sleep on a cancelled ctx", func() bool { return sleep(ctx, d) }) {
				t.Fatalf("sleep(cancelled, %v) = true, want false", d)
			}
		}
	})
	t.Run("cancelled during", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		started := make(chan struct{})
		res := make(chan bool, 1)
		go func() {
			close(started)
			res <- sleep(ctx, time.Hour)
		}()
		<-started
		cancel()
		select {
		case ok := <-res:
			if ok {
				t.Fatal("sleep(ctx, 1h) = true after cancel, want false")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("sleep did not return after its ctx was cancelled")
		}
	})
	t.Run("elapses", func(t *testing.T) {
		ctx := context.Background()
		for _, d := range []time.Duration{-time.Second, 0, time.Millisecond} {
			start := time.Now()
			if !promptly(t, "sleep", func() bool { return sleep(ctx, d) }) {
				t.Fatalf("sleep(live ctx, %v) = false, want true", d)
			}
			if el := time.Since(start); el < d {
				t.Fatalf("sleep(%v) returned after %v", d, el)
			}
		}
	})
}

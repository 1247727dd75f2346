package breaker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemhq/idem/breaker"
)

// TestLimitCollector drives a limited dependency through a wait for a token,
// a refusal, a call in flight and a Retry-After pause on the fake clock, and
// reads every series of the collector through a registry.
func TestLimitCollector(t *testing.T) {
	c := newClock()
	// The group's budget is 10 calls/s and 4 in flight; this member has half.
	set := newLimitedSet(t, c, breaker.Limits{Rate: 10, Burst: 1, MaxInFlight: 4, MaxWait: 250 * time.Millisecond})
	if err := set.SetShare(0.5); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(breaker.NewLimitCollector(set)); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if err := set.Do(ctx, "bank", ok); err != nil { // the bucket's one token
		t.Fatal(err)
	}
	second := async(ctx, set, ok) // its token comes in 200ms (5 calls/s): it waits
	c.waitTimers(t, 1)
	// A third would wait 400ms, past MaxWait: refused (rate).
	wantThrottle(t, set.Do(ctx, "bank", ok), breaker.ReasonRate, 400*time.Millisecond)
	c.Advance(200 * time.Millisecond)
	if err := result(t, second); err != nil {
		t.Fatal(err)
	}

	c.Advance(200 * time.Millisecond)
	running, release := make(chan struct{}), make(chan struct{})
	slow := async(ctx, set, func(context.Context) error { close(running); <-release; return nil })
	<-running
	t.Cleanup(func() {
		close(release)
		if err := result(t, slow); err != nil {
			t.Errorf("slow call: %v", err)
		}
	})

	c.Advance(200 * time.Millisecond)
	if d, ok := breaker.RetryAfter(set.Do(ctx, "bank", tooMany(2*time.Second))); !ok || d != 2*time.Second {
		t.Fatalf("the 429: RetryAfter %s, %v; want a 2s pause", d, ok)
	}
	c.Advance(500 * time.Millisecond)
	wantThrottle(t, set.Do(ctx, "bank", ok), breaker.ReasonRetryAfter, 1500*time.Millisecond)

	want := `
# HELP idem_dependency_in_flight Calls to the dependency running now through breaker.Set.Do.
# TYPE idem_dependency_in_flight gauge
idem_dependency_in_flight{dependency="bank"} 1
# HELP idem_dependency_max_in_flight This member's cap of calls in flight to the dependency (Limits.MaxInFlight times its share); 0 when there is none.
# TYPE idem_dependency_max_in_flight gauge
idem_dependency_max_in_flight{dependency="bank"} 2
# HELP idem_dependency_rate_limit This member's rate limit toward the dependency, in calls per second (Limits.Rate times its share); 0 when there is none.
# TYPE idem_dependency_rate_limit gauge
idem_dependency_rate_limit{dependency="bank"} 5
# HELP idem_dependency_throttled_seconds_total Seconds calls waited for a token or a call slot (reason wait, summed over calls), or the dependency was paused by its Retry-After (reason retry-after).
# TYPE idem_dependency_throttled_seconds_total counter
idem_dependency_throttled_seconds_total{dependency="bank",reason="retry-after"} 0.5
idem_dependency_throttled_seconds_total{dependency="bank",reason="wait"} 0.2
# HELP idem_dependency_throttled_total Calls to the dependency refused without waiting longer or paused, by reason: rate, in-flight, retry-after.
# TYPE idem_dependency_throttled_total counter
idem_dependency_throttled_total{dependency="bank",reason="in-flight"} 0
idem_dependency_throttled_total{dependency="bank",reason="rate"} 1
idem_dependency_throttled_total{dependency="bank",reason="retry-after"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// TestLimitCollectorSeries: a dependency without limits that was called
// through Set.Do has its full set of series (zeros); a Set with none has no
// series; the metrics pass the Prometheus linter.
func TestLimitCollectorSeries(t *testing.T) {
	c := newClock()
	set := newSet(t, c, breaker.Settings{})
	col := breaker.NewLimitCollector(set)
	if n := testutil.CollectAndCount(col); n != 0 {
		t.Fatalf("%d series before any dependency, want 0", n)
	}
	if err := set.Do(context.Background(), "ledger", ok); err != nil {
		t.Fatal(err)
	}
	if err := set.SetLimits("bank", breaker.Limits{MaxInFlight: 3}); err != nil {
		t.Fatal(err)
	}
	// 3 gauges + 2 throttled-seconds + 3 throttled-calls series each.
	if n := testutil.CollectAndCount(col); n != 2*8 {
		t.Fatalf("%d series for two dependencies, want 16", n)
	}
	want := `
# HELP idem_dependency_max_in_flight This member's cap of calls in flight to the dependency (Limits.MaxInFlight times its share); 0 when there is none.
# TYPE idem_dependency_max_in_flight gauge
idem_dependency_max_in_flight{dependency="bank"} 3
idem_dependency_max_in_flight{dependency="ledger"} 0
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(want), "idem_dependency_max_in_flight"); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(col)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

package consumer_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testenv"
)

// ledger is the bank's own record of the calls it got.
type ledger struct {
	mu    sync.Mutex
	calls []time.Time
}

func (l *ledger) call() {
	l.mu.Lock()
	l.calls = append(l.calls, time.Now())
	l.mu.Unlock()
}

// busiest is the most calls in any window of d.
func (l *ledger) busiest(d time.Duration) int {
	l.mu.Lock()
	ts := slices.Clone(l.calls)
	l.mu.Unlock()
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	most := 0
	for i, j := 0, 0; j < len(ts); j++ {
		for ts[j].Sub(ts[i]) >= d {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}

// TestRateLimitSplitAcrossMembers is issue 21 test 1: 2,000 messages, a
// limit of 200 calls/s to "bank" for the whole group, 3 members (each with
// its own breaker.Set, as in three processes). Once the group has settled,
// the bank's ledger sees at most 210 calls in any 1 s window, and every
// message is applied once.
func TestRateLimitSplitAcrossMembers(t *testing.T) {
	t.Parallel()
	const members, partitions, total, rate = 3, 6, 2000, 200
	e := newEnv(t, partitions)
	var bank ledger
	sets := make([]*breaker.Set, members)
	for i := range sets {
		var err error
		if sets[i], err = breaker.NewSet(breaker.Settings{}); err != nil {
			t.Fatal(err)
		}
		if err := sets[i].SetLimits("bank", breaker.Limits{Rate: rate, Burst: members}); err != nil {
			t.Fatal(err)
		}
		set := sets[i]
		eff := effectHandler()
		cfg := e.config()
		cfg.Registerer = prometheus.NewRegistry()
		cfg.Breakers = set
		start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
			if err := set.Do(ctx, "bank", func(context.Context) error { bank.call(); return nil }); err != nil {
				return err
			}
			return eff(ctx, m)
		}))
	}
	// Each member counted the group and took its share.
	testenv.Eventually(t, 90*time.Second, func() error {
		for i, s := range sets {
			if r := s.LimitStates()["bank"].Rate; math.Abs(r-float64(rate)/members) > 0.01 {
				return fmt.Errorf("member %d: rate %.2f, want %.2f", i, r, float64(rate)/members)
			}
		}
		return nil
	})
	started := time.Now()
	e.produce(coreKeys("rate", total), partitions)
	e.coreWaitEffects(total, 120*time.Second)
	e.coreAssertOnePerKey(total)
	took := time.Since(started)
	most := bank.busiest(time.Second)
	t.Logf("%d calls in %s; busiest 1 s window: %d calls", len(bank.calls), took.Round(time.Millisecond), most)
	if most > 210 {
		t.Errorf("the bank saw %d calls in one 1 s window, want <= 210", most)
	}
}

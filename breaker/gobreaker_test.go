package breaker_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
)

// TestMatchesGobreaker runs random outcome sequences through gobreaker,
// configured as documented in doc.go, and through this package, and checks
// that both are in the same state after every call. No time passes (within
// one Window, before any cool-down ends), which is where the two agree by
// design; the timed behaviour is covered by the fake-clock tests.
func TestMatchesGobreaker(t *testing.T) {
	configs := []breaker.Settings{
		{ConsecutiveFailures: 3},
		{ConsecutiveFailures: 100, FailureRatio: 0.5, MinRequests: 10},
		{ConsecutiveFailures: 4, FailureRatio: 0.3, MinRequests: 5},
	}
	permanent := handler.Permanent(errDown)
	for ci, s := range configs {
		for seed := range uint64(50) {
			rng := rand.New(rand.NewPCG(seed, uint64(ci)))
			gb := gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
				Name:    "dep",
				Timeout: time.Hour,
				ReadyToTrip: func(c gobreaker.Counts) bool {
					total := c.TotalSuccesses + c.TotalFailures
					return c.ConsecutiveFailures >= s.ConsecutiveFailures ||
						s.FailureRatio > 0 && total >= s.MinRequests && float64(c.TotalFailures)/float64(total) >= s.FailureRatio
				},
				IsExcluded: func(err error) bool { return err != nil && !breaker.IsFailure(err) },
			})
			b := newBreaker(t, newClock(), s)
			for i := 0; i < 60; i++ {
				var e error
				switch rng.IntN(5) {
				case 0, 1:
					e = errDown
				case 2:
					e = permanent
				}
				_, gerr := gb.Execute(func() (struct{}, error) { return struct{}{}, e })
				err := b.Do(context.Background(), func(context.Context) error { return e })
				if errors.Is(gerr, gobreaker.ErrOpenState) != breaker.Rejected(err) {
					t.Fatalf("config %d seed %d call %d: gobreaker err %v, breaker err %v", ci, seed, i, gerr, err)
				}
				if g, w := b.State(), breaker.State(gb.State()); g != w {
					t.Fatalf("config %d seed %d call %d: state %s, gobreaker %s", ci, seed, i, g, w)
				}
			}
		}
	}
}

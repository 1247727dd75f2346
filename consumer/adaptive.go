package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/internal/adaptive"
	"github.com/idemhq/idem/internal/mutate"
)

// Adaptive makes the number of handler calls in flight adapt to the
// dependency (issue 21, "Adaptive concurrency"): Config.Limits.Adaptive set,
// each partition gets Max lanes and a member-wide limit decides how many of
// this member's handler attempts may run at once. The limit grows while the
// attempts' latency holds and shrinks when it rises or a dependency answers
// 429 (a *breaker.ThrottleError with breaker.ReasonRetryAfter from the call
// itself): AIMD, additive increase by one per window of samples (doubling at
// first), multiplicative decrease by Backoff. AIMD rather than a gradient
// because a 429 is a loss signal and AIMD converges to a fair share between
// members, each running its own limit against one dependency (see
// internal/adaptive). With a dependency whose latency rises past N
// concurrent calls the limit settles between about 0.94 N and 1.1 N + 1.
// The current limit is the gauge idem_lanes{group}.
//
// Attempts refused without running (an open breaker, a paused dependency, a
// rate limit) and database outages are not samples: they say nothing of the
// dependency's latency. A batch (Config.Batch, a handler.Batch handler) is
// one attempt: it takes one slot under the limit, and its sample is its
// handler time per message.
type Adaptive struct {
	// Min is the lowest limit. Must be >= 1.
	// Default: 1.
	Min int
	// Max is the highest limit, and the lanes of each partition. Must be
	// between Min and 1024. Required.
	Max int
	// Tolerance is how much above the no-load latency a window's mean may
	// be and still hold. Must be > 1.
	// Default: 1.1.
	Tolerance float64
	// Backoff multiplies the limit on a decrease. In (0, 1), with
	// Backoff × Tolerance < 1.
	// Default: 0.85.
	Backoff float64
}

// withDefaults returns a copy of a with every zero optional field set to
// its documented default (adaptive.DefaultConfig).
func (a Adaptive) withDefaults() Adaptive {
	c := a.config().WithDefaults()
	return Adaptive{Min: c.Min, Max: c.Max, Tolerance: c.Tolerance, Backoff: c.Backoff}
}

// validate checks a as Run uses it.
func (a *Adaptive) validate() error {
	if a == nil {
		return nil
	}
	var errs []error
	if a.Max > 1024 {
		errs = append(errs, fmt.Errorf("at most 1024 lanes (as Concurrency), not Max = %d", a.Max))
	}
	return errors.Join(append(errs, a.config().Validate())...)
}

func (a *Adaptive) config() adaptive.Config {
	return adaptive.Config{Min: a.Min, Max: a.Max, Tolerance: a.Tolerance, Backoff: a.Backoff}
}

// lanesGate is Config.Limits.Adaptive's member-wide limit of handler
// attempts in flight; nil without Adaptive (every method is then a no-op).
type lanesGate struct {
	lim   *adaptive.Limiter
	gauge prometheus.Gauge

	mu    sync.Mutex
	inUse int
	freed chan struct{} // closed (and replaced) when a slot frees or the limit may have grown
}

func newLanesGate(a *Adaptive, gauge prometheus.Gauge) (*lanesGate, error) {
	if a == nil {
		return nil, nil
	}
	lim, err := adaptive.New(a.config())
	if err != nil {
		return nil, fmt.Errorf("consumer: Limits.Adaptive: %w", err)
	}
	gauge.Set(float64(lim.Limit()))
	return &lanesGate{lim: lim, gauge: gauge, freed: make(chan struct{})}, nil
}

// acquire waits for a slot under the limit; inFlight counts this attempt
// too. ok is false when ctx ended first.
func (g *lanesGate) acquire(ctx context.Context) (inFlight int, ok bool) {
	if g == nil {
		return 0, true
	}
	for {
		g.mu.Lock()
		if g.inUse < g.lim.Limit() || mutate.On(mutate.Adaptive) {
			g.inUse++
			n := g.inUse
			g.mu.Unlock()
			return n, true
		}
		ch := g.freed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// release frees the slot of an attempt that took took and ended with err,
// observing it unless it says nothing of the dependency's latency (by
// classify's class).
func (g *lanesGate) release(inFlight int, took time.Duration, err error, classify func(error) (class, error)) {
	if g == nil {
		return
	}
	if c, _ := classify(err); c != classOutage && c != classFatal && c != classExpired && !breaker.Rejected(err) {
		var te *breaker.ThrottleError
		throttled := errors.As(err, &te) && te.Reason == breaker.ReasonRetryAfter
		g.lim.Observe(adaptive.Sample{Latency: took, InFlight: inFlight, Throttled: throttled})
		g.gauge.Set(float64(g.lim.Limit()))
	}
	g.mu.Lock()
	g.inUse--
	close(g.freed)
	g.freed = make(chan struct{})
	g.mu.Unlock()
}

// Package adaptive is the controller of adaptive concurrency: it keeps a
// limit of concurrent calls (the consumer's lanes) between Min and Max,
// raising it while the latency of the calls holds and lowering it when the
// latency rises or the dependency answers 429.
//
// # The algorithm: AIMD on latency and 429s
//
// The limit moves once per window of samples (at least Config.Window, and at
// least the limit itself, so a window covers about one round of every lane):
//
//   - Additive increase: when the window's mean latency is within
//     Config.Tolerance of the baseline (the lowest window mean of the last
//     Config.BaselineWindows windows, the no-load latency) and the calls
//     filled the limit (a caller that has less work than lanes gets no more
//     lanes), the limit grows by 1. Until the first decrease it doubles
//     instead (slow start), so a consumer finds its level in a few windows.
//   - Multiplicative decrease: when the window's mean latency is above
//     Tolerance × baseline, or at once on a throttled call (an HTTP 429 or
//     503 with Retry-After), the limit is multiplied by Config.Backoff
//     (at least −1).
//
// After any change the samples of the calls still in flight at the old limit
// are left out: they show the old limit's latency (a window that mixed them
// in would overshoot by a step), and their 429s belong to the overload
// already answered, which is cut once, not once per call.
//
// Why AIMD and not a gradient (Netflix concurrency-limits' Gradient2 sets
// limit × minRTT/RTT + a queue allowance): a 429 is a loss signal, not a
// latency, and AIMD is the textbook answer to loss; and AIMD is the one of
// the two that converges to a fair share between independent senders (Chiu
// and Jain, 1989): the members of a consumer group each run their own
// controller against one dependency, and none of them must starve the others.
// Its behaviour is easy to bound: with a dependency whose latency rises past
// N concurrent calls, the limit moves between about Backoff × Tolerance × N
// and Tolerance × N + 1 (with the defaults, 0.94 N to 1.1 N + 1: within
// ±25 % of N for N >= 4; below that one step is already more than 25 %).
// Against a quota of Q calls answered with 429s it moves between about
// Backoff × Q and Q + 1. Config.Validate requires Backoff × Tolerance < 1, so
// every decrease brings the calls back under the no-load latency and the
// baseline is measured again; a baseline taken only under load would
// ratchet the limit up.
//
// A dependency that becomes slower for good (a new baseline) first drives the
// limit down; once its old, faster windows have left the last
// BaselineWindows, the baseline is the new latency and the limit grows again.
//
// github.com/platinummonkey/go-concurrency-limits was considered: its AIMD
// limit reacts to drops only (no latency), grows on every sample rather than
// once a window and has no upper bound, its gradient limits give no
// fair-share guarantee (TestFairShare checks this one's), and its module
// requires gRPC, protobuf and the DataDog client, which
// would all become requirements of idem's users. The controller here is one
// small state machine with no clock of its own: it is driven by samples only,
// so tests are deterministic and need no time.
//
// The package holds no mutable package-level state.
package adaptive

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// ErrInvalidConfig is wrapped by every error Config.Validate and New return.
var ErrInvalidConfig = errors.New("adaptive: invalid config")

// Config configures a Limiter. Zero fields take the values of
// DefaultConfig, except Max, which is required.
type Config struct {
	// Min is the lowest limit. Must be >= 1.
	// Default: 1
	Min int
	// Max is the highest limit. Must be >= Min. Required.
	Max int
	// Initial is the limit to start from, in Min…Max.
	// Default: Min
	Initial int
	// Tolerance is how much higher than the baseline (the no-load latency) a
	// window's mean latency may be and still count as holding. Must be > 1.
	// Default: 1.1
	Tolerance float64
	// Backoff multiplies the limit on a decrease. Must be in (0, 1), with
	// Backoff × Tolerance < 1.
	// Default: 0.85
	Backoff float64
	// Window is the least number of samples a decision is made on; a window
	// also holds at least as many samples as the limit. Must be >= 1.
	// Default: 10
	Window int
	// BaselineWindows is how many of the last windows the baseline is the
	// lowest mean of. Must be >= 1.
	// Default: 50
	BaselineWindows int
}

// DefaultConfig returns the defaults zero fields of Config take, the one
// place they are defined. Its Max is 0: Max has no default.
func DefaultConfig() Config {
	return Config{Min: 1, Tolerance: 1.1, Backoff: 0.85, Window: 10, BaselineWindows: 50}
}

// WithDefaults returns c with its zero fields set.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	if c.Min == 0 {
		c.Min = d.Min
	}
	if c.Initial == 0 {
		c.Initial = c.Min
	}
	if c.Tolerance == 0 {
		c.Tolerance = d.Tolerance
	}
	if c.Backoff == 0 {
		c.Backoff = d.Backoff
	}
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.BaselineWindows == 0 {
		c.BaselineWindows = d.BaselineWindows
	}
	return c
}

// Validate reports every problem with c (defaults applied), joined, each
// naming the field, its value and the bound, and wrapping ErrInvalidConfig.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(field string, v any, rule string) {
		errs = append(errs, fmt.Errorf("%w: %s = %v, %s", ErrInvalidConfig, field, v, rule))
	}
	if c.Min < 1 {
		bad("Min", c.Min, "must be >= 1")
	}
	if c.Max < c.Min {
		bad("Max", c.Max, fmt.Sprintf("must be >= Min (%d)", c.Min))
	}
	if c.Initial < c.Min || c.Initial > c.Max {
		bad("Initial", c.Initial, fmt.Sprintf("must be in Min…Max (%d…%d)", c.Min, c.Max))
	}
	if math.IsNaN(c.Tolerance) || math.IsInf(c.Tolerance, 0) || c.Tolerance <= 1 {
		bad("Tolerance", c.Tolerance, "must be a finite number > 1")
	}
	if math.IsNaN(c.Backoff) || c.Backoff <= 0 || c.Backoff >= 1 {
		bad("Backoff", c.Backoff, "must be in (0, 1)")
	} else if c.Tolerance > 1 && c.Backoff*c.Tolerance >= 1 {
		bad("Backoff", c.Backoff, fmt.Sprintf("× Tolerance (%v) must be < 1, so that a decrease brings the calls back under the no-load latency", c.Tolerance))
	}
	if c.Window < 1 {
		bad("Window", c.Window, "must be >= 1")
	}
	if c.BaselineWindows < 1 {
		bad("BaselineWindows", c.BaselineWindows, "must be >= 1")
	}
	return errors.Join(errs...)
}

// Sample is what one finished call tells the Limiter.
type Sample struct {
	// Latency is how long the call took. A throttled call's latency is not
	// used.
	Latency time.Duration
	// InFlight is the number of calls in flight when this one started, itself
	// included.
	InFlight int
	// Throttled reports that the dependency asked us to slow down: an HTTP
	// 429, or a 503 with Retry-After, answered to this call.
	Throttled bool
}

// Limiter is the controller. It is safe for concurrent use. Create one with
// New.
type Limiter struct {
	cfg Config

	mu        sync.Mutex
	limit     int
	slowStart bool
	holdoff   int // samples still to leave out after a decrease

	// The current window.
	n           int           // latency samples
	sum         time.Duration // their total
	maxInFlight int

	means []time.Duration // the last BaselineWindows window means, a ring
	next  int             // where the next mean goes in means
}

// New returns a Limiter at cfg.Initial (Min by default), or an error
// wrapping ErrInvalidConfig.
func New(cfg Config) (*Limiter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	return &Limiter{cfg: cfg, limit: cfg.Initial, slowStart: true}, nil
}

// Limit returns the current limit, in Min…Max.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}

// Observe takes the sample of one finished call, and may move the limit.
func (l *Limiter) Observe(s Sample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.holdoff > 0 {
		l.holdoff-- // a call started at the old limit
		return
	}
	if s.Throttled {
		l.decrease()
		return
	}
	l.n++
	l.sum += max(s.Latency, 0)
	l.maxInFlight = max(l.maxInFlight, s.InFlight)
	if l.n < max(l.cfg.Window, l.limit) {
		return
	}
	mean := l.sum / time.Duration(l.n)
	full := l.maxInFlight >= l.limit
	l.resetWindow()
	if len(l.means) < l.cfg.BaselineWindows {
		l.means = append(l.means, mean)
	} else {
		l.means[l.next] = mean
	}
	l.next = (l.next + 1) % l.cfg.BaselineWindows
	baseline := mean
	for _, m := range l.means {
		baseline = min(baseline, m)
	}
	switch {
	case float64(mean) > l.cfg.Tolerance*float64(baseline):
		l.decrease()
	case !full: // fewer calls than the limit: more lanes would not be used
		return
	default:
		l.increase()
	}
}

// increase adds 1 to the limit (doubles it in slow start), at most up to
// Max, and leaves out the samples of the calls still in flight at the old
// limit: they would show the old limit's latency as the new one's. mu must be
// held.
func (l *Limiter) increase() {
	old := l.limit
	if l.slowStart {
		l.limit = min(l.cfg.Max, 2*old)
	} else {
		l.limit = min(l.cfg.Max, old+1)
	}
	if l.limit != old {
		l.holdoff = old
	}
}

// decrease multiplies the limit by Backoff (at least −1, at most down to
// Min), ends slow start, starts a new window, and leaves out the samples of
// the calls still in flight at the old limit. mu must be held.
func (l *Limiter) decrease() {
	old := l.limit
	l.limit = max(l.cfg.Min, min(old-1, int(float64(old)*l.cfg.Backoff)))
	l.slowStart = false
	l.holdoff = old - 1 // the calls in flight with this one (or before it)
	l.resetWindow()
}

func (l *Limiter) resetWindow() {
	l.n, l.sum, l.maxInFlight = 0, 0, 0
}

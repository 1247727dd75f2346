package breaker

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/idemhq/idem/internal/configerr"
)

// Set holds named breakers, one per dependency ("bank-api", "ledger-db"…),
// each created on first use, and the flow limits of each dependency
// (SetLimits, SetShare). It is safe for concurrent use. The zero Set is ready
// to use, with the zero Settings (every field its default), no limits and a share of 1.
type Set struct {
	base  Settings  // as given to NewSet, before defaults
	after afterFunc // nil: real timers; tests set a fake

	mu        sync.Mutex
	overrides map[string]Settings // per-name Settings, merged with base, before defaults
	breakers  map[string]*circuit
	flows     map[string]*flow
	share     float64 // this member's share of every limit; 0 means 1
}

// NewSet returns an empty Set whose breakers use s. Zero fields of s take the
// documented defaults. It returns s.Validate's error (the only one it
// returns) if s is not valid.
func NewSet(s Settings) (*Set, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &Set{base: s}, nil
}

// Configure sets the Settings of the breaker called name, which must not have
// been created yet (by Do). Zero fields of st take the Set's
// Settings (as given to NewSet), and the zero fields of those take
// their documented defaults; so an override need only name what differs, and it keeps
// the Set's OnStateChange unless it sets its own. A later Configure of the
// same name replaces an earlier one.
//
// It returns an error if the breaker exists, or the merged Settings'
// Validate error.
func (s *Set) Configure(name string, st Settings) error {
	merged := st.withDefaults(s.base)
	if err := merged.Validate(); err != nil {
		return fmt.Errorf("breaker: Configure(%q): %w", name, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.breakers[name]; ok {
		return fmt.Errorf("breaker: Configure(%q): %w; configure it before its first use", name, errInUse)
	}
	if s.overrides == nil {
		s.overrides = make(map[string]Settings)
	}
	s.overrides[name] = merged
	if f, ok := s.flows[name]; ok { // SetLimits came first: use this clock
		f.mu.Lock()
		f.now = merged.withDefaults(defaultSettings()).Now
		f.mu.Unlock()
	}
	return nil
}

// breaker returns the breaker called name, creating it. mu must be held.
func (s *Set) breaker(name string) *circuit {
	if b, ok := s.breakers[name]; ok {
		return b
	}
	b := newBreaker(name, s.settings(name))
	if s.breakers == nil {
		s.breakers = make(map[string]*circuit)
	}
	s.breakers[name] = b
	return b
}

// settings returns the Settings of name, defaults applied. mu must be held.
func (s *Set) settings(name string) Settings {
	st, ok := s.overrides[name]
	if !ok {
		st = s.base
	}
	return st.withDefaults(defaultSettings())
}

// flow returns the flow control of name, creating it. mu must be held.
func (s *Set) flow(name string) *flow {
	if f, ok := s.flows[name]; ok {
		return f
	}
	f := &flow{name: name, now: s.settings(name).Now}
	if s.flows == nil {
		s.flows = make(map[string]*flow)
	}
	s.flows[name] = f
	return f
}

// Do calls fn for the dependency called name, through its limits (if
// SetLimits gave it any) and its breaker, and returns fn's error unchanged
// unless the breaker, a pause or the limits refuse the call (fn is then not
// run, and Do returns an *OpenError or a *ThrottleError: IsOpen holds). In
// order:
//  1. If ctx is done, Do returns ctx.Err(). If the breaker is open, or the
//     dependency is paused by a Retry-After answer, or a half-open breaker
//     has no probe slot free, Do returns its *OpenError or *ThrottleError at
//     once, without taking a token or waiting.
//  2. It waits for a token of the rate limit, then for a call slot, at most
//     Limits.MaxWait in all (less if ctx's deadline comes sooner). When the
//     token would come later than that, Do returns at once a *ThrottleError
//     (ReasonRate) whose RetryAfter is the token's wait, and gives the token
//     back; when no slot comes free in time, a *ThrottleError
//     (ReasonInFlight) with RetryAfter = MaxWait. If ctx ends while waiting,
//     Do returns ctx.Err() and gives the token back.
//  3. fn runs through the breaker, holding its slot until it returns.
//
// The breaker of name, created closed on its first use:
//   - Closed: fn runs. Its outcome is counted: nil is a success; a context
//     error while ctx is done is not counted; otherwise Settings.IsFailure
//     decides between failure and not counted. The breaker opens when
//     ConsecutiveFailures failures come in a row, or when FailureRatio is met
//     within the Window (see Settings).
//   - Open: rejected with State Open and RetryAfter = time left of the
//     cool-down (OpenTimeout from the moment it opened, by Settings.Now).
//   - Half-open (the cool-down has passed): the first HalfOpenProbes calls are
//     let through as probes; the others are rejected with State HalfOpen and
//     RetryAfter = min(OpenTimeout, 1s). One probe failure opens the breaker
//     again for a full, fresh cool-down. When HalfOpenProbes probes have
//     succeeded the breaker closes with cleared counts. A probe that is not
//     counted (permanent error, caller's ctx done) frees its slot.
//   - An outcome that arrives after the state changed (e.g. a slow call
//     admitted while closed that fails after the breaker opened) is ignored.
//   - If fn panics, the call counts as a failure and the panic continues.
//
// A dependency may also ask to be left alone for a while: fn returns an error
// made by handler.RetryAfter(err, d) (handler.RetryAfterOf finds it) for its
// HTTP 429, or 503 with Retry-After. Then:
//   - the call is not counted (the dependency answered; it is not down), and a
//     probe that gets such an answer frees its slot;
//   - every call is paused for d (min(OpenTimeout, 1s) if d <= 0) from now; a
//     pause already running that ends later is kept;
//   - Do returns a *ThrottleError (ReasonRetryAfter) whose Cause is fn's error
//     and whose RetryAfter is the time left of the pause, so a consumer pauses
//     instead of spending a retry;
//   - while the pause lasts Do does not run fn and returns a *ThrottleError
//     (ReasonRetryAfter, no Cause) with RetryAfter = the time left. An open
//     breaker's *OpenError takes precedence.
//
// Only errors fn returns count as such an answer: a handler's own
// handler.RetryAfter, returned outside any Do, pauses nothing. An error that
// is already IsOpen (from a breaker or pause nested inside fn) or permanent
// is not one either.
//
// Waiting is not an attempt: nothing of steps 1 and 2 is counted by the
// breaker and fn has not run. The *OpenError and *ThrottleError of those
// steps satisfy IsOpen and Rejected, so a consumer pauses the partition for
// RetryAfter and spends no retry budget on them.
//
// Why Do waits, and why not for long: a short wait (tokens come every
// 1/rate seconds) is the cheapest back-pressure, and keeps the message
// where it is. A long one would hold the caller's transaction, its lane and
// its partition with no bound; past MaxWait the consumer is better off
// rolling back and pausing for RetryAfter, which it does for any error that
// satisfies IsOpen.
func (s *Set) Do(ctx context.Context, name string, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	b, f := s.breaker(name), s.flow(name)
	s.mu.Unlock()
	err := s.do(ctx, b, f, fn)
	f.count(err)
	return err
}

func (s *Set) do(ctx context.Context, b *circuit, f *flow, fn func(ctx context.Context) error) error {
	// Refuse at once what the breaker would refuse after the wait: a token
	// taken for a call that cannot run is lost to those that can.
	_, err := b.allow(false)
	b.deliver()
	if err != nil {
		return err
	}
	after := s.after
	if after == nil {
		after = realAfter
	}
	release, err := f.acquire(ctx, after)
	if err != nil {
		return err
	}
	defer release()
	return b.Do(ctx, fn)
}

// SetLimits sets the flow limits of the dependency called name, before or
// after its first use; it replaces earlier limits at once (calls already
// waiting keep the token times they reserved). l is the budget of the whole
// consumer group: this member enforces l scaled by its share (SetShare).
// Zero fields of l take their documented defaults. It returns l.Validate's
// error, listing every problem, if l is not valid.
func (s *Set) SetLimits(name string, l Limits) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("breaker: SetLimits(%q): %w", name, err)
	}
	l = l.withDefaults()
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flow(name)
	f.mu.Lock()
	f.limits = &l
	f.apply(s.shareOf())
	f.mu.Unlock()
	return nil
}

// SetShare sets this member's share of every dependency's limits: Rate is
// multiplied by fraction, Burst and MaxInFlight too, rounded down and at least
// 1 (see Limits). It applies at once to the limits set so far and to later
// ones.
//
// A cluster-wide budget is split across the group's members this way: the
// consumer calls SetShare on each rebalance with 1/members, the number of
// members of its group in the new generation (or with the fraction of the
// group's partitions it was assigned). Until then the share is 1: a member
// alone uses the whole budget. During a rebalance, members that have not
// rescaled yet may briefly use more than their share.
//
// fraction must be in (0, 1]; otherwise SetShare changes nothing and returns
// an error naming the fraction.
func (s *Set) SetShare(fraction float64) error {
	if math.IsNaN(fraction) || fraction <= 0 || fraction > 1 {
		l := configerr.New(errInvalidSettings, "")
		l.Bad("SetShare(fraction)", fraction, "must be in (0,1]: 1/members of the group")
		return l.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.share = fraction
	for _, f := range s.flows {
		f.mu.Lock()
		f.apply(fraction)
		f.mu.Unlock()
	}
	return nil
}

// shareOf returns the share, 1 if never set. mu must be held.
func (s *Set) shareOf() float64 {
	if s.share == 0 {
		return 1
	}
	return s.share
}

// LimitStates returns a snapshot of the flow control of every dependency
// called through Do or given limits so far, by name: this member's current
// limits (after SetShare), the calls in flight, and counters of the time
// spent waiting, the time paused by Retry-After answers and the calls
// throttled. It is meant for metrics, read at each scrape as States is: the
// consumer (or the user) exports the current limit as a gauge and
// Waited + Paused as the dependency's throttled seconds.
func (s *Set) LimitStates() map[string]LimitState {
	s.mu.Lock()
	type pair struct {
		f *flow
		b *circuit
	}
	ps := make([]pair, 0, len(s.flows))
	for name, f := range s.flows {
		ps = append(ps, pair{f, s.breakers[name]})
	}
	s.mu.Unlock()
	out := make(map[string]LimitState, len(ps))
	for _, p := range ps {
		st := p.f.state()
		if p.b != nil {
			st.PauseLeft, st.Paused = p.b.paused()
		}
		out[p.f.name] = st
	}
	return out
}

// States returns the current state of every breaker created so far, by name.
// Reading a state may notice that a cool-down is over and move that breaker
// from open to half-open.
func (s *Set) States() map[string]State {
	s.mu.Lock()
	bs := make([]*circuit, 0, len(s.breakers))
	for _, b := range s.breakers {
		bs = append(bs, b)
	}
	s.mu.Unlock()
	out := make(map[string]State, len(bs))
	for _, b := range bs {
		out[b.name] = b.State()
	}
	return out
}

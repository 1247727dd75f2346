package consumer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
)

// pauseReason says who wants a partition's fetching paused; a partition is
// paused while any reason holds.
type pauseReason uint8

const (
	pauseBackpressure pauseReason = 1 << iota // the partition's queue is above its high-water mark
	pauseBreaker                              // a dependency's breaker is open
	pauseOperator                             // an operator paused it (Config.Controls, control.go)
	pauseRedrive                              // a re-drive reads its window again (control.go)
)

// label is idem_partitions_paused's reason for a partition paused for why:
// the first it holds of operator, redrive, breaker and backpressure, so
// that each paused partition counts once.
func (why pauseReason) label() string {
	switch {
	case why&pauseOperator != 0:
		return "operator"
	case why&pauseRedrive != 0:
		return "redrive"
	case why&pauseBreaker != 0:
		return "breaker"
	}
	return "backpressure"
}

// names lists every reason why holds, in label's order.
func (why pauseReason) names() []string {
	var out []string
	for _, r := range []pauseReason{pauseOperator, pauseRedrive, pauseBreaker, pauseBackpressure} {
		if why&r != 0 {
			out = append(out, r.label())
		}
	}
	return out
}

type tp struct {
	topic     string
	partition int32
}

// pauser applies sarama Pause/Resume per partition from several reasons.
type pauser struct {
	group  sarama.ConsumerGroup
	paused *prometheus.GaugeVec // idem_partitions_paused of the group, by reason (label)

	mu      sync.Mutex
	reasons map[tp]pauseReason
}

func newPauser(g sarama.ConsumerGroup, paused *prometheus.GaugeVec) *pauser {
	return &pauser{group: g, paused: paused, reasons: map[tp]pauseReason{}}
}

func (p *pauser) set(k tp, why pauseReason, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	was := p.reasons[k]
	now := was &^ why
	if on {
		now = was | why
	}
	if now == 0 {
		delete(p.reasons, k)
	} else {
		p.reasons[k] = now
	}
	parts := map[string][]int32{k.topic: {k.partition}}
	switch {
	case was == 0 && now != 0:
		p.group.Pause(parts)
	case was != 0 && now == 0:
		p.group.Resume(parts)
	}
	if was != 0 && (now == 0 || was.label() != now.label()) {
		p.paused.WithLabelValues(was.label()).Dec()
	}
	if now != 0 && (was == 0 || was.label() != now.label()) {
		p.paused.WithLabelValues(now.label()).Inc()
	}
}

// why returns the reasons partition k is paused for (none: nil).
func (p *pauser) why(k tp) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reasons[k].names()
}

// forget drops a partition that is no longer claimed.
func (p *pauser) forget(k tp) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if why := p.reasons[k]; why != 0 {
		p.group.Resume(map[string][]int32{k.topic: {k.partition}})
		p.paused.WithLabelValues(why.label()).Dec()
	}
	delete(p.reasons, k)
}

// gate turns "a dependency's breaker is open" into "this consumer stops
// consuming": while it is closed messages flow; when a handler reports an open
// breaker the gate closes every claimed partition (their fetching is paused, and
// workers wait before their next attempt) until the breaker's cool-down ends.
// Then fetching resumes, so that a message can come to be the probe even to a
// claim that has none buffered (one that joined during the cool-down: the
// session before it ended), and exactly one worker goes through as the
// half-open probe while the others keep waiting (what is fetched meanwhile is
// bounded by backpressure); the probe's outcome decides: anything but an open breaker opens
// the gate for all and resumes fetching (a limit or a 429 of a dependency,
// breaker.IsThrottled, too: the probe's message alone then waits for that
// dependency); an open breaker closes it for another cool-down. No retry
// budget is spent and nothing is forwarded meanwhile.
type gate struct {
	r *runner

	mu      sync.Mutex
	until   time.Time       // zero: open (messages flow)
	closed  atomic.Bool     // !until.IsZero(), readable without mu (wait's fast path)
	probing bool            // a probe is running
	changed chan struct{}   // closed and replaced on every change
	members map[tp]struct{} // partitions whose workers are running
	name    string          // the breaker that closed the gate
	since   time.Time
	// halfOpen: the cool-down ended and fetching resumed for the probe.
	halfOpen bool
	cooled   *time.Timer // ends the cool-down (halfOpen); nil until the first trip
	stopped  bool        // close was called: the timer is not armed again
}

func newGate(r *runner) *gate {
	return &gate{r: r, changed: make(chan struct{}), members: map[tp]struct{}{}}
}

func (g *gate) broadcast() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// join registers a claimed partition; if the gate is closed it is paused at once.
func (g *gate) join(k tp) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members[k] = struct{}{}
	if !g.until.IsZero() && !g.halfOpen {
		g.r.pauses.set(k, pauseBreaker, true)
	}
}

func (g *gate) leave(k tp) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.members, k)
}

// trip closes the gate for d, reported by a handler as an open breaker.
func (g *gate) trip(err error) {
	d, _ := breaker.RetryAfter(err)
	d = max(d, 10*time.Millisecond)
	var oe *breaker.OpenError
	var te *breaker.ThrottleError
	name, reason := "", ""
	switch {
	case errors.As(err, &oe):
		name = oe.Name
	case errors.As(err, &te):
		name, reason = te.Name, string(te.Reason)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	until := time.Now().Add(d)
	if g.until.IsZero() {
		g.since = time.Now()
		g.name = name
		for k := range g.members {
			g.r.pauses.set(k, pauseBreaker, true)
		}
		if te != nil {
			g.r.log.Warn("idem: dependency throttled; consumption paused", "breaker", name, "reason", reason, "retry_after", d)
		} else {
			g.r.log.Warn("idem: dependency breaker open; consumption paused", "breaker", name, "retry_after", d)
		}
	}
	if until.After(g.until) {
		g.until = until
	}
	if g.halfOpen { // a probe failed: fetching pauses again
		g.halfOpen = false
		for k := range g.members {
			g.r.pauses.set(k, pauseBreaker, true)
		}
	}
	g.armLocked()
	g.closed.Store(true)
	// A running probe keeps its slot (probing): a trip from another worker
	// only extends the cool-down, and the probe's own end (probeDone,
	// probeAbandoned) frees it.
	g.broadcast()
}

// armLocked arms the timer that ends the current cool-down (at g.until).
func (g *gate) armLocked() {
	if g.stopped {
		return
	}
	until := g.until
	if g.cooled != nil {
		g.cooled.Stop()
	}
	g.cooled = time.AfterFunc(time.Until(until), func() { g.cooledDown(until) })
}

// cooledDown ends the cool-down that was to end at until, unless the gate
// opened or closed for longer since: fetching resumes so that a message comes
// to be the probe; the workers still wait at the gate, and one goes through.
func (g *gate) cooledDown(until time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped || g.halfOpen || g.until.IsZero() || !g.until.Equal(until) {
		return
	}
	g.halfOpen = true
	for k := range g.members {
		g.r.pauses.set(k, pauseBreaker, false)
	}
	g.broadcast()
}

// close stops the cool-down timer; Run calls it once every claim has ended.
func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.stopped = true
	if g.cooled != nil {
		g.cooled.Stop()
	}
}

// wait blocks while the gate is closed. It returns probe=true when the caller
// is the one worker let through as the half-open probe (it must then call
// probeDone), and ok=false if ctx is done (checked first, so a stopping
// partition starts no new attempt even while the gate is open).
func (g *gate) wait(ctx context.Context) (probe bool, ok bool) {
	for {
		if ctx.Err() != nil { // stopping: start nothing new, open gate or not
			return false, false
		}
		if !g.closed.Load() { // the common case: no breaker open
			return false, true
		}
		g.mu.Lock()
		if g.until.IsZero() {
			g.mu.Unlock()
			return false, true
		}
		ch := g.changed
		left := time.Until(g.until)
		if left <= 0 && !g.probing {
			g.probing = true
			g.mu.Unlock()
			return true, true
		}
		g.mu.Unlock()
		var t *time.Timer
		var timer <-chan time.Time
		if left > 0 {
			t = time.NewTimer(left)
			timer = t.C
		}
		select {
		case <-ch:
		case <-timer:
		case <-ctx.Done():
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return false, false
		}
	}
}

// probeDone reports a probe's outcome. reopened is true when the probe met an
// open breaker again (trip has then been called); otherwise the gate opens.
func (g *gate) probeDone(reopened bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	if reopened || g.until.IsZero() {
		g.broadcast()
		return
	}
	g.r.log.Info("idem: probe passed; consumption resumed", "breaker", g.name, "paused_for", time.Since(g.since).Round(time.Millisecond))
	g.until = time.Time{}
	g.halfOpen = false
	if g.cooled != nil {
		g.cooled.Stop()
	}
	g.closed.Store(false)
	for k := range g.members {
		g.r.pauses.set(k, pauseBreaker, false)
	}
	g.broadcast()
}

// open reports the breaker that closed the gate, since when and until when
// (ok false: the gate is open).
func (g *gate) open() (name string, since, until time.Time, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.name, g.since, g.until, !g.until.IsZero()
}

// probeAbandoned gives the probe slot back (the prober's partition stopped).
func (g *gate) probeAbandoned() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	g.broadcast()
}

package consumer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
)

// A claimed partition's side of the live controls (control.go): its
// pauses, which hold the partition's workers, and its holding source.

// claimCtl is the live controls of one claimed partition.
type claimCtl struct {
	ctl    *controls
	c      *claim
	source string // the partition's topic's source topic

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	paused  bool          // an operator pause holds it
	redrive int64         // the re-drive it runs now (0: none)
	inHand  int           // workers (and the lanes' dispatcher) holding a message they took
	working bool          // a worker asked for a message: the claim's recoveries are over
	lanes   []chanSource  // the lanes' channels (Concurrency > 1)
	quiet   bool          // quiesce found no message in hand: the re-drive reads
	ended   map[int64]bool

	next      atomic.Int64 // the next offset to take, for the lag; -1 until known
	pausedNow atomic.Bool  // paused, read without mu (resumed's fast path)
	wake      chan struct{}
}

// join registers a claim starting (claim.run) and returns what its end
// runs: it stops the claim's re-drive, if any, and forgets it.
func (c *controls) join(cl *claim) func() {
	if c == nil {
		return func() {}
	}
	cc := &claimCtl{ctl: c, c: cl, source: c.sources[cl.tp.topic], changed: make(chan struct{}), ended: map[int64]bool{}, wake: make(chan struct{}, 1)}
	cc.next.Store(-1)
	if o := cl.kc.InitialOffset(); o >= 0 {
		cc.next.Store(o)
	}
	c.mu.Lock()
	c.claims[cl.tp] = cc
	c.kmem = cl.sess.MemberID()
	c.mu.Unlock()
	cl.ctl = cc
	cc.update()
	var wg sync.WaitGroup
	if cc.source == cl.tp.topic { // re-drives are of source topics
		wg.Go(cc.redrives)
	}
	c.kick()
	return func() {
		cl.stop()
		wg.Wait()
		c.mu.Lock()
		if c.claims[cl.tp] == cc {
			delete(c.claims, cl.tp)
		}
		c.mu.Unlock()
		c.kick()
	}
}

// source returns src held by the live controls of cl's partition: the
// partition's queue (its one worker's, or the lanes' dispatcher's) holds
// for a pause and for a re-drive; a lane's channel holds for a pause only,
// so that a re-drive's hold lets the lanes finish what was dispatched to
// them (with Transactions a lane's forward may wait for an earlier message
// of another lane: holding that one would hold both until the claim ends).
func (c *controls) source(cl *claim, src source) source {
	if c == nil {
		return src
	}
	c.mu.Lock()
	cc := c.claims[cl.tp]
	c.mu.Unlock()
	if cc == nil {
		return src
	}
	h := &heldSource{cc: cc, src: src, redrive: true}
	if lane, ok := src.(chanSource); ok {
		h.redrive = false
		cc.mu.Lock()
		cc.lanes = append(cc.lanes, lane)
		cc.mu.Unlock()
	}
	return h
}

// broadcast wakes those waiting for a change; cc.mu is held.
func (cc *claimCtl) broadcast() {
	close(cc.changed)
	cc.changed = make(chan struct{})
}

// holds reports whether h must hold now: before the first state read,
// while paused, and while a re-drive runs: a queue's source from its
// start, a lane's once the lanes are quiet (a message a lane received just
// as they became quiet waits); cc.mu is held.
func (cc *claimCtl) holds(h *heldSource) bool {
	return cc.ctl.state.Load() == nil || cc.paused || (cc.redrive != 0 && (h.redrive || cc.quiet))
}

// update follows the state: the operator pause, and a re-drive to run.
func (cc *claimCtl) update() {
	s := cc.ctl.state.Load()
	if s == nil {
		return
	}
	t := cc.c.tp
	p, paused := s.Paused(t.topic, t.partition)
	if !paused && cc.source != "" && cc.source != t.topic {
		p, paused = s.Paused(cc.source, t.partition)
	}
	cc.mu.Lock()
	was := cc.paused
	cc.paused = paused
	cc.pausedNow.Store(paused)
	if paused != was {
		cc.ctl.r.pauses.set(t, pauseOperator, paused) // under cc.mu: two updates cannot cross
	}
	cc.broadcast()
	cc.mu.Unlock()
	if paused != was {
		if paused {
			cc.c.log.Info("idem: partition paused by an operator", "paused_by", p.By, "reason", p.Reason, "pause", p.What())
		} else {
			cc.c.log.Info("idem: partition resumed by an operator")
		}
	}
	select {
	case cc.wake <- struct{}{}:
	default:
	}
}

// wait waits for a change; false when ctx ended first. cc.mu is held, and
// held again on return.
func (cc *claimCtl) wait(ctx context.Context) bool {
	ch := cc.changed
	cc.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
	cc.mu.Lock()
	return ctx.Err() == nil
}

// heldSource is a worker's (or the lanes' dispatcher's) source held by the
// live controls.
type heldSource struct {
	cc      *claimCtl
	src     source
	redrive bool // it holds while a re-drive runs, too
	holding bool // the worker holds a message it took from here
}

func (h *heldSource) pop(ctx context.Context) (*sarama.ConsumerMessage, bool) {
	cc := h.cc
	cc.mu.Lock()
	if h.holding { // its previous message reached its outcome
		h.holding = false
		cc.inHand--
	}
	cc.working = true
	cc.broadcast()
	for cc.holds(h) { // take nothing while held: it stays queued
		if !cc.wait(ctx) {
			cc.mu.Unlock()
			return nil, false
		}
	}
	cc.mu.Unlock()
	m, ok := h.src.pop(ctx)
	if !ok {
		return nil, false
	}
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for cc.holds(h) { // held while this worker waited: keep m, do not handle it yet
		if !cc.wait(ctx) {
			return nil, false // stopping: m is redelivered to the next owner
		}
	}
	h.holding = true
	cc.inHand++
	cc.taken(m)
	return m, true
}

func (h *heldSource) more(ctx context.Context, wait time.Duration) (*sarama.ConsumerMessage, bool) {
	cc := h.cc
	cc.mu.Lock()
	held := cc.holds(h)
	cc.mu.Unlock()
	if held {
		return nil, false // the batch closes; the worker holds at its next pop
	}
	m, ok := h.src.more(ctx, wait)
	if ok {
		cc.taken(m)
	}
	return m, ok
}

// taken notes that m was taken, for the lag.
func (cc *claimCtl) taken(m *sarama.ConsumerMessage) {
	for {
		n := cc.next.Load()
		if m.Offset < n || cc.next.CompareAndSwap(n, m.Offset+1) {
			return
		}
	}
}

// quiesce waits until no worker has a message in hand and the lanes'
// channels are empty (the claim's recoveries over); false when ctx ended
// first.
func (cc *claimCtl) quiesce(ctx context.Context) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for !cc.working || cc.inHand > 0 || slices.ContainsFunc(cc.lanes, func(l chanSource) bool { return len(l) > 0 }) {
		if !cc.wait(ctx) {
			return false
		}
	}
	cc.quiet = true
	return true
}

// unpaused waits while an operator pause holds the partition; false when
// ctx ended first.
func (cc *claimCtl) unpaused(ctx context.Context) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for cc.paused {
		if !cc.wait(ctx) {
			return false
		}
	}
	return true
}

// resumed waits, before an attempt at a message of c's partition, while an
// operator pause holds it: a message taken before the pause, or waiting
// for its retry tier's due time, is not handled until the resume. false:
// the partition is stopping.
func (c *claim) resumed() bool {
	if c.ctl == nil || !c.ctl.pausedNow.Load() {
		return true
	}
	return c.ctl.unpaused(c.stopCtx)
}

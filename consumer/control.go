package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/control"
)

// The live controls (Config.Controls; internal/control has the tables). A
// member obeys its group's operator pauses and re-drives, which a
// control.Watcher keeps up to date (LISTEN/NOTIFY, and a re-read every 30 s),
// and writes a heartbeat row for the fleet page.
//
//   - A paused partition (its own pause, or its topic's; a retry tier's or
//     deferred topic's partition follows its source topic's pauses) has its
//     fetching paused (idem_partitions_paused{reason="operator"}) and its
//     workers hold: a worker takes no new message (one it took is kept, not
//     handled, and one in the middle of being handled finishes). Offsets
//     stay. Until the first state is read, every claim holds, so a pause
//     holds across restarts and rebalances.
//   - A re-drive of a source topic is run by the member that owns each
//     partition: it holds the partition's workers as for a pause and waits
//     until none has a message in hand, reads the window again from the
//     part's progress (straight from the leader, read_committed), takes each
//     record to its outcome on a worker of its own, and records its progress
//     every second and at the end; then the workers go on. The group's
//     offsets never move back.
//   - Every record is handled under the epoch of the re-drives whose window
//     holds its origin (control.State.Epoch): the re-drive's own reads, the
//     live records of a window not reached yet, a retry tier's or deferred
//     copy, a redelivery. The inbox keys the record by that epoch, so each
//     key of a window runs once more, and a crash anywhere (the progress
//     behind what was handled) only makes duplicates.

// Timings of the live controls.
const (
	beatEvery     = 10 * time.Second       // a heartbeat
	beatGap       = 500 * time.Millisecond // at least this between two beats
	progressEvery = time.Second            // a re-drive's progress row
)

// controlsTiming, carried by Run's ctx (tests only), shortens the beat and
// the watcher's re-read.
type controlsTiming struct{ beat, reread time.Duration }

type controlsTimingKey struct{}

// controls is a member's part in the live controls; nil without
// Config.Controls, and then each method does nothing.
type controls struct {
	r       *runner
	pool    *pgxpool.Pool
	client  sarama.Client
	id      string // this Run's member id
	host    string
	started time.Time
	every   time.Duration
	sources map[string]string // every subscribed topic → its source topic

	state atomic.Pointer[control.State] // nil until the first read
	beat  chan struct{}                 // asks the heartbeat for a beat now

	mu     sync.Mutex
	claims map[tp]*claimCtl
	kmem   string // the group coordinator's member id of this member
}

// startControls starts the live controls when Config.Controls is set: it
// creates their tables, then watches the group's state and beats, on
// watchCtx (wg waits for both).
func (r *runner) startControls(ctx, watchCtx context.Context, wg *sync.WaitGroup, st setup, client sarama.Client) error {
	pool := r.cfg.Controls
	if pool == nil {
		return nil
	}
	if err := st.retry(ctx, nil, "creating the live controls' tables", func() error { return control.Migrate(ctx, pool) }); err != nil {
		return fmt.Errorf("consumer: live controls' tables: %w", err)
	}
	host, _ := os.Hostname()
	var rnd [3]byte
	_, _ = rand.Read(rnd[:])
	c := &controls{r: r, pool: pool, client: client, host: host, started: time.Now(), every: beatEvery,
		id:      host + "/" + strconv.Itoa(os.Getpid()) + "/" + hex.EncodeToString(rnd[:]),
		sources: map[string]string{}, beat: make(chan struct{}, 1), claims: map[tp]*claimCtl{}}
	for _, t := range r.cfg.Topics {
		c.sources[t] = t
		for _, tier := range r.rules.TierTopics(t, r.cfg.Group) {
			c.sources[tier] = t
		}
		if r.cfg.Defer != nil {
			c.sources[deferredTopic(t, r.cfg.Group)] = t
		}
	}
	w := &control.Watcher{Pool: pool, Group: r.cfg.Group, Log: r.log, Apply: c.apply}
	if t, ok := ctx.Value(controlsTimingKey{}).(controlsTiming); ok {
		c.every, w.Reread = t.beat, t.reread
	}
	r.ctl = c
	wg.Go(func() { w.Run(watchCtx) })
	wg.Go(func() { c.heartbeat(watchCtx) })
	return nil
}

// apply takes a state the watcher read.
func (c *controls) apply(s control.State) {
	first := c.state.Swap(&s) == nil
	if first {
		c.r.log.Info("idem: live controls read", "pauses", len(s.Pauses), "redrives", len(s.Redrives))
	}
	c.mu.Lock()
	ccs := make([]*claimCtl, 0, len(c.claims))
	for _, cc := range c.claims {
		ccs = append(ccs, cc)
	}
	c.mu.Unlock()
	for _, cc := range ccs {
		cc.update()
	}
	c.kick()
}

// kick asks for a heartbeat now.
func (c *controls) kick() {
	select {
	case c.beat <- struct{}{}:
	default:
	}
}

// epoch returns the replay epoch of the record whose origin is
// topic/partition/offset, and sets msg.Epoch to it (0 without controls).
func (c *controls) epoch(msg *handler.Message, topic string, partition int32, offset int64) int64 {
	if c == nil {
		return 0
	}
	var e int64
	if s := c.state.Load(); s != nil && len(s.Redrives) > 0 {
		e = s.Epoch(topic, partition, offset)
	}
	msg.Epoch = e
	return e
}

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

// setRedrive marks re-drive id as running on the partition (0: none).
func (cc *claimCtl) setRedrive(id int64) {
	cc.mu.Lock()
	cc.redrive = id
	cc.quiet = false
	cc.ctl.r.pauses.set(cc.c.tp, pauseRedrive, id != 0)
	cc.broadcast()
	cc.mu.Unlock()
	cc.ctl.kick()
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

// errRedriveEnded stops a re-drive's read: it was cancelled, or ended.
var errRedriveEnded = errors.New("consumer: re-drive ended")

// redrives runs the re-drives of the partition, one at a time, until the
// claim ends.
func (cc *claimCtl) redrives() {
	ctx := cc.c.stopCtx
	for failures := 0; ; {
		if s := cc.ctl.state.Load(); s != nil {
			if rd, _, ok := s.Active(cc.c.tp.topic, cc.c.tp.partition); ok && !cc.ended[rd.ID] {
				if cc.redriveOnce(ctx, rd) {
					failures = 0
				} else if failures++; !sleep(ctx, cc.ctl.r.wait.outage(failures)) {
					return
				}
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-cc.wake:
		}
	}
}

// redriveOnce runs re-drive rd's part of the partition from its progress;
// false: it failed and is to be tried again.
func (cc *claimCtl) redriveOnce(ctx context.Context, rd control.Redrive) bool {
	c, r, t := cc.ctl, cc.ctl.r, cc.c.tp
	part, state, err := control.PartOf(ctx, c.pool, rd.ID, t.partition)
	switch {
	case err != nil:
		cc.c.log.Warn("idem: re-drive: read its progress", "redrive", rd.ID, "err", err)
		return false
	case state != control.Running || part.Done:
		cc.ended[rd.ID] = true
		return true
	}
	cc.setRedrive(rd.ID)
	defer cc.setRedrive(0)
	if !cc.quiesce(ctx) {
		return true
	}
	log := cc.c.log.With("redrive", rd.ID, "epoch", rd.Epoch)
	log.Info("idem: re-driving a window", "from", part.Next, "end", part.End, "started_at", part.Start)
	w := cc.c.redriveClaim(rd.ID, rd.Epoch).newWorker()
	var lim *rate.Limiter
	if rd.Rate > 0 {
		lim = rate.NewLimiter(rate.Limit(rd.Rate), 1)
	}
	next, saved, lastSave := part.Next, part.Next, time.Now()
	save := func() error {
		if next == saved {
			return nil
		}
		if r.txn != nil { // the forwards of what was re-driven commit first
			if err := r.commitTxn(cc.c.sess); err != nil {
				return err
			}
		}
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		if _, err := control.Progress(qctx, c.pool, rd.ID, t.partition, next, c.id); err != nil {
			return err
		}
		saved = next
		return nil
	}
	err = control.ReadWindow(ctx, c.client, t.topic, t.partition, part.Next, part.End, func(m *sarama.ConsumerMessage) error {
		if s := c.state.Load(); s != nil && !s.Running(rd.ID) {
			return errRedriveEnded
		}
		if !cc.unpaused(ctx) {
			return errStopping
		}
		if lim != nil && lim.Wait(ctx) != nil {
			return errStopping
		}
		if err := w.handle(m); err != nil {
			return err
		}
		next = m.Offset + 1
		if time.Since(lastSave) >= progressEvery {
			lastSave = time.Now()
			if err := save(); err != nil {
				log.Warn("idem: re-drive: progress not recorded; trying again in a second", "next", next, "err", err)
			}
		}
		return nil
	})
	if err == nil {
		next = part.End
	}
	serr := save()
	switch {
	case err == nil && serr == nil:
		log.Info("idem: re-drive of the partition done", "end", part.End)
		cc.ended[rd.ID] = true
		return true
	case errors.Is(err, errRedriveEnded):
		log.Info("idem: re-drive cancelled; stopped", "next", next)
		cc.ended[rd.ID] = true
		return true
	case ctx.Err() != nil || errors.Is(err, errStopping):
		return true // the claim ends: the partition's next owner goes on
	}
	log.Warn("idem: re-drive failed; trying again from its progress", "next", saved, "err", errors.Join(err, serr))
	return false
}

// redriveClaim is a claim of the partition for a re-drive's worker: the
// partition's session, contexts and metrics, no tracker (a record's
// outcome moves the re-drive's progress, never the group's offset: redo)
// and no stall watch.
func (c *claim) redriveClaim(id, epoch int64) *claim {
	return &claim{r: c.r, sess: c.sess, kc: c.kc, tp: c.tp, log: c.log.With("redrive", id, "epoch", epoch), debug: c.debug,
		tier: c.tier, mxs: c.mxs, obs: c.obs, stopCtx: c.stopCtx, stop: c.stop, hctx: c.hctx, hcancel: c.hcancel, ctl: c.ctl, redo: true}
}

// heartbeat writes the member's row every beat and when kicked (claims,
// pauses), at most every beatGap, and deletes it when ctx ends.
func (c *controls) heartbeat(ctx context.Context) {
	t := time.NewTicker(c.every)
	defer t.Stop()
	defer func() {
		qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := control.Leave(qctx, c.pool, c.r.cfg.Group, c.id); err != nil {
			c.r.log.Debug("idem: live controls: leave the fleet", "err", err)
		}
	}()
	for {
		qctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := control.Beat(qctx, c.pool, c.member())
		cancel()
		if err != nil && ctx.Err() == nil {
			c.r.log.Debug("idem: live controls: heartbeat", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.beat:
			if !sleep(ctx, beatGap) { // gather what else changes
				return
			}
		}
	}
}

// member is the member's heartbeat row now.
func (c *controls) member() control.Member {
	c.mu.Lock()
	ccs := make([]*claimCtl, 0, len(c.claims))
	for _, cc := range c.claims {
		ccs = append(ccs, cc)
	}
	kmem := c.kmem
	c.mu.Unlock()
	var st control.Status
	for _, cc := range ccs {
		t := cc.c.tp
		ps := control.PartitionStatus{Topic: t.topic, Partition: t.partition, Lag: -1, Paused: c.r.pauses.why(t)}
		if next, hwm := cc.next.Load(), cc.c.kc.HighWaterMarkOffset(); next >= 0 && hwm >= 0 {
			ps.Lag = max(hwm-next, 0)
		}
		cc.mu.Lock()
		ps.Redrive = cc.redrive
		cc.mu.Unlock()
		st.Partitions = append(st.Partitions, ps)
	}
	slices.SortFunc(st.Partitions, func(a, b control.PartitionStatus) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		return int(a.Partition - b.Partition)
	})
	if name, since, until, ok := c.r.gate.open(); ok {
		st.Breaker = &control.BreakerStatus{Name: name, Since: since, Until: until}
	}
	return control.Member{Group: c.r.cfg.Group, ID: c.id, InstanceID: c.r.cfg.InstanceID, KafkaMember: kmem, Host: c.host,
		Version: idemVersion(), StartedAt: c.started, BeatEvery: c.every, Status: st}
}

// idemVersion is idem's module version in this binary, with Go's.
func idemVersion() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		const mod = "github.com/idemhq/idem"
		if bi.Main.Path == mod && bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, d := range bi.Deps {
			if d.Path == mod {
				v = d.Version
			}
		}
	}
	return "idem " + v + ", " + runtime.Version()
}

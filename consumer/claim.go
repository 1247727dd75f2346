package consumer

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/correlation"
	"github.com/idemhq/idem/internal/tables"
)

// LaneKey is what Config.LaneBy hashes to pick a message's lane.
type LaneKey int

const (
	// LaneByIdempotencyKey keeps the order of messages with one idempotency
	// key. The default.
	LaneByIdempotencyKey LaneKey = iota
	// LaneByKafkaKey keeps the order of messages with one Kafka record key.
	LaneByKafkaKey
)

// String returns "idempotency-key" or "kafka-key".
func (l LaneKey) String() string {
	switch l {
	case LaneByIdempotencyKey:
		return "idempotency-key"
	case LaneByKafkaKey:
		return "kafka-key"
	}
	return fmt.Sprintf("LaneKey(%d)", int(l))
}

// lanes checks Config.Concurrency and Config.LaneBy.
func (c configCheck) lanes() {
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		c.errs.Bad("Concurrency", c.Concurrency, "must be between 1 and 1024")
	}
	if c.LaneBy != LaneByIdempotencyKey && c.LaneBy != LaneByKafkaKey {
		c.errs.Bad("LaneBy", c.LaneBy, "unknown lane key")
	}
}

// claim is one claimed partition: it owns the claim's queue, fetch
// back-pressure, the dispatch of messages to its workers (one, or one per
// lane with Config.Concurrency > 1) and the offset tracker. Its reader
// goroutine drains the Kafka claim into the queue, so a revoke is seen at
// once; its workers take the messages to their outcomes.
type claim struct {
	r     *runner
	sess  sarama.ConsumerGroupSession
	kc    sarama.ConsumerGroupClaim // the Kafka claim
	tp    tp
	log   *slog.Logger
	debug bool // log at DEBUG: checked before building debug attributes
	tier  bool // the topic is a retry tier, not a source topic
	mxs   []partMetrics
	obs   *partObs // end-to-end latency and in-flight messages of the claim

	// stopCtx is cancelled when the claim ends (revoked, session over, Run
	// cancelled): no new message is taken, waits between attempts end.
	stopCtx context.Context
	stop    context.CancelFunc
	// hctx is the handlers' ctx: cancelled ShutdownGrace after stopCtx, so an
	// in-flight message may finish (and be marked) within the grace period.
	hctx    context.Context
	hcancel context.CancelFunc

	// track marks offsets finished out of order (lanes, batches); nil when
	// messages finish in order and are marked directly.
	track *tracker
	// main is the claim's own worker: it runs the start-of-claim recovery
	// and, with one lane, every message; workers are the lanes' workers
	// (Concurrency > 1).
	main    *worker
	workers []*worker

	stalls  []*stall         // every worker's stall
	stalled prometheus.Gauge // idem_partition_stalled_seconds of this partition

	// ctl is the partition's live controls (Config.Controls, control.go);
	// nil without. redo: a re-drive's claim, whose worker's outcomes move
	// the re-drive's progress, never the group's offset.
	ctl  *claimCtl
	redo bool

	// owner is this claim's token in the ordering store (txnHold.claimOwner,
	// Transactions): the owner of every mark it writes, refused once another
	// claim of the partition came. "" without Transactions.
	owner string

	bp bpState // back-pressure
}

// bpState is whether a partition's fetching is paused by back-pressure.
type bpState struct {
	mu sync.Mutex  // serialises transitions
	on atomic.Bool // fast-path read
}

func newClaim(r *runner, s sarama.ConsumerGroupSession, kc sarama.ConsumerGroupClaim) *claim {
	c := &claim{
		r: r, sess: s, kc: kc,
		tp:    tp{kc.Topic(), kc.Partition()},
		log:   r.log.With("topic", kc.Topic(), "partition", kc.Partition()),
		debug: r.log.Enabled(context.Background(), slog.LevelDebug),
		tier:  !slices.Contains(r.cfg.Topics, kc.Topic()),
		mxs:   newRouteMetrics(r, kc.Topic()),
		obs:   newPartObs(r, kc.Topic()),
	}
	c.stopCtx, c.stop = context.WithCancel(r.baseCtx)
	c.hctx, c.hcancel = context.WithCancel(r.baseCtx)
	if r.cfg.Concurrency > 1 || r.routes.batches {
		c.track = newTracker(c)
	}
	c.main = c.newWorker()
	if n := r.cfg.Concurrency; n > 1 {
		for range n {
			c.workers = append(c.workers, c.newWorker())
		}
	}
	return c
}

// newWorker returns a worker of c with a stall of its own.
func (c *claim) newWorker() *worker {
	w := &worker{claim: c, stall: &stall{}, msgs: messages{names: headerNames{}},
		ob: observer{r: c.r, log: c.log, tp: c.tp, hctx: correlation.WithSlot(c.hctx)}}
	w.callFn = w.callHandler
	// The step scope of its handlers' calls, over the correlation slot
	// (steps.go): callHandler names each call's message in it.
	w.steps = tables.StepScope{DB: c.r.stepDB, Group: c.r.cfg.Group}
	w.ob.hctx = tables.WithStepScope(w.ob.hctx, &w.steps)
	w.useRoute(c.r.routes.all[0])
	c.stalls = append(c.stalls, w.stall)
	return w
}

// backpressure pauses or resumes fetching when the queue crosses its marks;
// the transition is taken under bpMu so pause and resume cannot cross.
func (c *claim) backpressure(on bool) {
	if c.bp.on.Load() == on {
		return
	}
	c.bp.mu.Lock()
	defer c.bp.mu.Unlock()
	if c.bp.on.Load() != on {
		c.r.pauses.set(c.tp, pauseBackpressure, on)
		c.bp.on.Store(on)
	}
}

// run handles the claim until it ends. It marks an offset only after the
// message's outcome is durable and only before it returns, so never after the
// claim is lost.
func (c *claim) run() {
	r := c.r
	q := newQueue()
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		c.stop()
		c.hcancel()
		wg.Wait()
		r.gate.leave(c.tp)
		r.pauses.forget(c.tp)
	}()
	r.gate.join(c.tp)
	defer r.claims.register(c)()
	defer r.ctl.join(c)() // Config.Controls: operator pauses and re-drives (control.go)

	// The reader drains Messages so that its closing (revocation) is seen at
	// once, and pauses fetching when the worker falls behind. What sarama has
	// already buffered is taken without the select (a non-blocking receive
	// each) and queued under one lock, up to readBurst records: the select
	// per record was 15 % of the no-op path's CPU. A failed transaction
	// (Transactions) stops the claim, which ends the session: the next one
	// reads from the committed offsets.
	txnFailed := memberTxn{r}.failed()
	wg.Go(func() {
		defer c.stop()
		msgs := c.kc.Messages()
		burst := make([]*sarama.ConsumerMessage, 0, readBurst)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					return
				}
				burst = append(burst[:0], m)
				open := true
				for open && len(burst) < readBurst {
					select {
					case m, open = <-msgs:
						if open {
							burst = append(burst, m)
						}
						continue
					default:
					}
					break
				}
				if q.push(burst...) {
					c.backpressure(true)
				}
				clear(burst)
				if !open {
					return
				}
			case <-c.sess.Context().Done():
				return
			case <-txnFailed:
				return
			case <-r.runCtx.Done():
				return
			case <-done:
				return
			}
		}
	})
	// The grace timer: once stopping, the in-flight handler has ShutdownGrace.
	wg.Go(func() {
		select {
		case <-c.stopCtx.Done():
		case <-done:
			return
		}
		t := time.NewTimer(r.cfg.ShutdownGrace)
		defer t.Stop()
		select {
		case <-t.C:
			c.log.Warn("idem: in-flight message exceeded the shutdown grace; cancelling it", "grace", r.cfg.ShutdownGrace)
			c.hcancel()
		case <-done:
		}
	})

	// The reader runs before anything else, so a revoke stops the claim's
	// recoveries at once, too: the claim of the partition in the ordering
	// store, the hooks a previous owner's committed transaction owes
	// (Transactions), and pending ordering forwards.
	if (txnHold{c.main}).claimOwner() != nil {
		return
	}
	if (txnHold{c.main}).claimHooks() != nil {
		return
	}
	if r.order != nil && (orderingClaim{c.main}).claim() != nil {
		return
	}
	if len(c.workers) > 0 {
		c.lanes(q)
		return
	}
	c.main.work(r.ctl.source(c, queueSource{c, q}))
}

// readBurst bounds the records the reader queues at once.
const readBurst = 256

// laneBuffer bounds the messages queued for one lane; with the partition
// queue's high-water mark it bounds a partition's in-flight messages.
const laneBuffer = 256

// tracker marks offsets when messages finish out of order (lanes, batches
// with a failed member): the committed offset is the lowest unfinished one,
// so an offset is marked only when every message below it is final.
type tracker struct {
	c       *claim
	mu      sync.Mutex
	pending []int64 // offsets handed out, in order, not yet below the mark
	done    map[int64]struct{}
	// moved is closed when the mark moves; made only by waitFirst
	// (Transactions), nil otherwise.
	moved chan struct{}
}

func newTracker(c *claim) *tracker {
	return &tracker{c: c, done: map[int64]struct{}{}}
}

// add registers the next offset handed to a worker. Offsets arrive in order.
func (t *tracker) add(offset int64) {
	t.mu.Lock()
	t.pending = append(t.pending, offset)
	t.mu.Unlock()
}

// finish records that offset reached its outcome and marks the longest
// finished prefix.
func (t *tracker) finish(offset int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done[offset] = struct{}{}
	mark := int64(-1)
	for len(t.pending) > 0 {
		o := t.pending[0]
		if _, ok := t.done[o]; !ok {
			break
		}
		delete(t.done, o)
		t.pending = t.pending[1:]
		mark = o
	}
	if mark >= 0 {
		t.c.markOffset(mark + 1)
		if t.moved != nil {
			close(t.moved)
			t.moved = nil
		}
	}
}

// waitFirst waits until offset is the partition's lowest unfinished offset:
// every message before it is final. waiting runs, with the lowest
// unfinished offset, before the first wait. false: ctx ended first.
func (t *tracker) waitFirst(ctx context.Context, offset int64, waiting func(first int64)) bool {
	for n := 0; ; n++ {
		t.mu.Lock()
		if len(t.pending) == 0 || t.pending[0] >= offset {
			t.mu.Unlock()
			return true
		}
		first := t.pending[0]
		if t.moved == nil {
			t.moved = make(chan struct{})
		}
		moved := t.moved
		t.mu.Unlock()
		if n == 0 {
			waiting(first)
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return false
		}
	}
}

// source is where a worker takes its messages from: the partition's queue or
// a lane's channel.
type source interface {
	// pop waits for the next message; false when the worker must stop.
	pop(ctx context.Context) (*sarama.ConsumerMessage, bool)
	// more returns the next message if one arrives within wait.
	more(ctx context.Context, wait time.Duration) (*sarama.ConsumerMessage, bool)
}

// queueSource is the partition's own queue (one lane): it lifts
// back-pressure below the low-water mark and registers offsets with the
// tracker, if any.
type queueSource struct {
	c *claim
	q *queue
}

func (s queueSource) pop(ctx context.Context) (*sarama.ConsumerMessage, bool) {
	m, low, ok := s.q.pop(ctx)
	if ok {
		s.c.popped(m, low)
	}
	return m, ok
}

func (s queueSource) more(ctx context.Context, wait time.Duration) (*sarama.ConsumerMessage, bool) {
	m, low, ok := s.q.tryPop(ctx, wait)
	if ok {
		s.c.popped(m, low)
	}
	return m, ok
}

// chanSource is one lane's channel, filled by the dispatcher.
type chanSource chan *sarama.ConsumerMessage

func (c chanSource) pop(ctx context.Context) (*sarama.ConsumerMessage, bool) {
	select {
	case m, ok := <-c:
		return m, ok && ctx.Err() == nil
	case <-ctx.Done():
		return nil, false
	}
}

func (c chanSource) more(ctx context.Context, wait time.Duration) (*sarama.ConsumerMessage, bool) {
	select {
	case m, ok := <-c:
		return m, ok
	default:
	}
	if wait <= 0 {
		return nil, false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case m, ok := <-c:
		return m, ok
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, false
}

// popped runs for every message taken from the partition's queue.
func (c *claim) popped(m *sarama.ConsumerMessage, low bool) {
	c.obs.taken()
	if low {
		c.backpressure(false)
	}
	if c.track != nil {
		c.track.add(m.Offset)
	}
}

// lanes runs Config.Concurrency workers fed by a dispatcher that hashes each
// message's lane key; it returns when the queue or the partition stops.
func (c *claim) lanes(q *queue) {
	n := c.r.cfg.Concurrency
	chans := make([]chan *sarama.ConsumerMessage, n)
	var wg sync.WaitGroup
	for i := range chans {
		chans[i] = make(chan *sarama.ConsumerMessage, laneBuffer)
		w := c.workers[i]
		src := c.r.ctl.source(c, chanSource(chans[i]))
		wg.Go(func() { w.work(src) })
	}
	defer func() {
		for _, ch := range chans {
			close(ch)
		}
		wg.Wait()
	}()
	src := c.r.ctl.source(c, queueSource{c, q})
	for {
		m, ok := src.pop(c.stopCtx)
		if !ok {
			return
		}
		select {
		case chans[c.laneOf(m, n)] <- m:
		case <-c.stopCtx.Done():
			return
		}
	}
}

// laneOf hashes m's lane key (Config.LaneBy; the Kafka key with
// Ordering ByKey) onto n lanes. A KeyFunc whose dependency is down is waited
// for (untilUp), so that every message of a key takes the same lane.
func (c *claim) laneOf(m *sarama.ConsumerMessage, n int) int {
	h := fnv.New32a()
	if c.r.cfg.LaneBy == LaneByKafkaKey || c.r.order != nil {
		h.Write(m.Key)
	} else {
		var k string
		if rt, msg := c.routeOf(m); rt != nil { // its route's KeyFunc
			_ = c.untilUp(func() (err error) { // errStopping: the lane does not matter
				k, err = callKeyFunc(rt.keyFunc, msg)
				return err
			})
		}
		h.Write([]byte(k))
	}
	return int(h.Sum32() % uint32(n))
}

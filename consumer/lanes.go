package consumer

import (
	"context"
	"errors"
	"hash/fnv"
	"runtime/debug"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/metrics"
)

// laneBuffer bounds the messages queued for one lane; with the partition
// queue's high-water mark it bounds a partition's in-flight messages.
const laneBuffer = 256

// tracker marks offsets when messages finish out of order (lanes, batches
// with a failed member): the committed offset is the lowest unfinished one,
// so an offset is marked only when every message below it is final.
type tracker struct {
	p       *partition
	mu      sync.Mutex
	pending []int64 // offsets handed out, in order, not yet below the mark
	done    map[int64]struct{}
}

func newTracker(p *partition) *tracker {
	return &tracker{p: p, done: map[int64]struct{}{}}
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
		t.p.sess.MarkOffset(t.p.tp.topic, t.p.tp.partition, mark+1, "")
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
	p *partition
	q *queue
}

func (s queueSource) pop(ctx context.Context) (*sarama.ConsumerMessage, bool) {
	m, low, ok := s.q.pop(ctx)
	if ok {
		s.p.popped(m, low)
	}
	return m, ok
}

func (s queueSource) more(ctx context.Context, wait time.Duration) (*sarama.ConsumerMessage, bool) {
	m, low, ok := s.q.tryPop(ctx, wait)
	if ok {
		s.p.popped(m, low)
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
func (p *partition) popped(m *sarama.ConsumerMessage, low bool) {
	p.obs.taken()
	if low {
		p.backpressure(false)
	}
	if p.track != nil {
		p.track.add(m.Offset)
	}
}

// lanes runs Config.Concurrency workers fed by a dispatcher that hashes each
// message's lane key; it returns when the queue or the partition stops.
func (p *partition) lanes(q *queue) {
	n := p.r.cfg.Concurrency
	chans := make([]chan *sarama.ConsumerMessage, n)
	var wg sync.WaitGroup
	for i := range chans {
		chans[i] = make(chan *sarama.ConsumerMessage, laneBuffer)
		lp := p.views[i]
		src := chanSource(chans[i])
		wg.Go(func() { lp.work(src) })
	}
	defer func() {
		for _, c := range chans {
			close(c)
		}
		wg.Wait()
	}()
	src := queueSource{p, q}
	for {
		m, ok := src.pop(p.stopCtx)
		if !ok {
			return
		}
		select {
		case chans[p.laneOf(m, n)] <- m:
		case <-p.stopCtx.Done():
			return
		}
	}
}

// laneOf hashes m's lane key (Config.LaneBy; the Kafka key with
// OrderingByKey) onto n lanes.
func (p *partition) laneOf(m *sarama.ConsumerMessage, n int) int {
	h := fnv.New32a()
	if p.r.cfg.LaneBy == LaneByKafkaKey || p.r.order != nil {
		h.Write(m.Key)
	} else {
		k, _ := callKeyFunc(p.r.cfg.KeyFunc, toMessage(m))
		h.Write([]byte(k))
	}
	return int(h.Sum32() % uint32(n))
}

// work takes messages from src to their outcomes, one at a time or in
// batches, until src or the partition stops.
func (p *partition) work(src source) {
	bc := p.r.cfg.Batch
	var batch []*batchItem
	for {
		m, ok := src.pop(p.stopCtx)
		if !ok {
			return
		}
		if bc.MaxMessages <= 1 {
			if !p.handle(m) {
				return
			}
			continue
		}
		// Gather consecutive batchable messages, within the batch's size
		// and latency budget (BatchConfig.MaxLatency); a message that is not
		// batchable ends the batch and is handled alone after it.
		batch = batch[:0]
		limit, opened := p.batchLimit(), time.Now()
		var alone *sarama.ConsumerMessage
		for {
			if it, ok := p.prepare(m); ok {
				batch = append(batch, it)
			} else {
				alone = m
				break
			}
			if len(batch) >= limit {
				break
			}
			wait := bc.MaxWait
			if bc.MaxLatency > 0 && wait > 0 {
				if wait = min(wait, bc.MaxLatency-time.Since(opened)); wait <= 0 {
					break // the batch is as old as its budget: close it
				}
			}
			if m, ok = src.more(p.stopCtx, wait); !ok {
				break
			}
		}
		if len(batch) > 0 && !p.handleBatch(batch) {
			return
		}
		if alone != nil && !p.handle(alone) {
			return
		}
	}
}

// batchLimit is how many messages the next batch may take: MaxMessages, or
// fewer when the handler time per message of the worker's recent batches
// says more would not get through within BatchConfig.MaxLatency.
func (p *partition) batchLimit() int {
	bc := p.r.cfg.Batch
	if bc.MaxLatency <= 0 || p.batchCost <= 0 {
		return bc.MaxMessages
	}
	return max(1, min(bc.MaxMessages, int(bc.MaxLatency/p.batchCost)))
}

// costed folds the time a successful batch of n messages took into the
// worker's handler time per message (an exponentially weighted average, so
// a handler that slows down or speeds up is followed within a few batches).
func (p *partition) costed(d time.Duration, n int) {
	if n <= 0 {
		return
	}
	c := d / time.Duration(n)
	if p.batchCost == 0 {
		p.batchCost = c
		return
	}
	p.batchCost += (c - p.batchCost) / 4
}

// batchItem is one message prepared for a batch.
type batchItem struct {
	cm  *sarama.ConsumerMessage
	msg *handler.Message
	rec dedupe.Record
}

// prepare returns cm ready for a batch, or false when it must be handled
// alone: a retry-tier record (it may have to wait for its due time), a record
// without a valid key, ordering mode, or a store without batches.
func (p *partition) prepare(cm *sarama.ConsumerMessage) (*batchItem, bool) {
	r := p.r
	if r.order != nil || r.batchStore == nil || p.tier {
		return nil, false
	}
	msg := p.message(cm)
	msg.Attempt = 1
	o := origin{topic: cm.Topic, partition: cm.Partition, offset: cm.Offset}
	key, err := p.key(msg, o)
	if err != nil {
		return nil, false
	}
	msg.IdempotencyKey = key
	return &batchItem{cm: cm, msg: msg, rec: dedupe.Record{Group: r.cfg.Group, Key: key, Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset}}, true
}

// handleBatch runs items in one transaction and marks them; on a failure it
// falls back to one transaction per message (see Config.Batch). false means
// the partition is stopping.
func (p *partition) handleBatch(items []*batchItem) bool {
	r := p.r
	probe, ok := r.gate.wait(p.stopCtx)
	if !ok {
		return false
	}
	if probe { // the half-open probe is one message, not a batch
		r.gate.probeAbandoned()
		return p.alone(items, nil)
	}
	recs := make([]dedupe.Record, len(items))
	for i, it := range items {
		recs[i] = it.rec
	}
	start := time.Now()
	var fresh []int
	failedAt := -1 // the item whose handler failed (per-message handler)
	outs, err := r.batchStore.ProcessBatch(p.hctx, recs, func(ctx context.Context, idx []int) (err error) {
		fresh = idx
		ctx, span := p.batchSpan(ctx, items, idx)
		defer func() { batchSpanEnd(span, err) }()
		if r.bh != nil {
			msgs := make([]*handler.Message, len(idx))
			for j, i := range idx {
				msgs[j] = items[i].msg
			}
			return callBatch(ctx, r.bh, msgs)
		}
		for _, i := range idx {
			if err := r.h.Handle(ctx, items[i].msg); err != nil {
				failedAt = i
				return err
			}
		}
		return nil
	})
	if err == nil {
		took := time.Since(start)
		p.costed(took, len(items))
		d := took.Seconds()
		for i, it := range items {
			if outs[i] == dedupe.Duplicate {
				p.mx.duplicate.Inc()
			} else {
				p.mx.processed.Inc()
				p.mx.attemptOK.Inc()
				p.mx.duration.Observe(d)
			}
			p.mark(it.cm)
		}
		return true
	}
	if p.hctx.Err() != nil {
		r.m.Abandoned.WithLabelValues(r.cfg.Group).Add(float64(len(items)))
		return false
	}
	if p.debug {
		p.log.Debug("idem: batch failed; running its messages one by one", "messages", len(items), "new", len(fresh), "err", err)
	}
	if r.bh != nil { // a batch handler's panic; a per-message one is logged when it runs alone
		p.logPanic(err, items[0].msg)
	}
	firsts := make([]error, len(items))
	if be, _ := handler.AsBatchError(err); be != nil {
		for _, f := range be.Failed {
			for i, it := range items {
				if it.msg == f.Message {
					firsts[i] = f.Err
				}
			}
		}
	} else if failedAt >= 0 && !txAborted(err) {
		firsts[failedAt] = err
	}
	return p.alone(items, firsts)
}

// alone is the one way out of a failed batch: each message runs alone, one
// transaction each, in the batch's order, so nothing after a failing message
// commits before that message's own outcome (the order LaneBy promises). A
// non-nil firsts[i] is the failure the batch pinned on items[i] (the
// per-message handler failed on it, or a *handler.BatchError named it): it
// counts as that message's first attempt, so a permanent one goes to the DLQ
// without running again. A failure nobody can be blamed for pins nothing.
// false means the partition is stopping.
func (p *partition) alone(items []*batchItem, firsts []error) bool {
	for i, it := range items {
		var first error
		if firsts != nil {
			first = firsts[i]
		}
		if !p.handleAfter(it.cm, first) {
			return false
		}
	}
	return true
}

// txAborted reports whether err is PostgreSQL refusing a statement because
// an earlier one failed in the same transaction (SQLSTATE 25P02): in a batch
// the message that made it fail is an earlier one whose handler swallowed
// its error, not the one that got the refusal.
func txAborted(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "25P02"
}

// callBatch calls h, turning a panic into a *handler.PanicError.
func callBatch(ctx context.Context, h handler.BatchHandler, msgs []*handler.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &handler.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h.HandleBatch(ctx, msgs)
}

// partMetrics are the collectors of one partition's hot path, with their
// labels resolved once.
type partMetrics struct {
	processed, duplicate, attemptOK, commits interface{ Inc() }
	duration                                 interface{ Observe(float64) }
}

// attempt counts a failed handler attempt by its result.
func (partMetrics) attempt(m *metrics.Metrics, group, topic string, herr error) {
	result := metrics.ResultError
	switch {
	case handler.IsPanic(herr):
		result = metrics.ResultPanic
	case breaker.IsOpen(herr):
		result = metrics.ResultBreakerOpen
	}
	m.Attempts.WithLabelValues(group, topic, result).Inc()
}

func newPartMetrics(m *metrics.Metrics, group, topic string) partMetrics {
	return partMetrics{
		processed: m.Messages.WithLabelValues(group, topic, metrics.OutcomeProcessed),
		duplicate: m.Messages.WithLabelValues(group, topic, metrics.OutcomeDuplicate),
		attemptOK: m.Attempts.WithLabelValues(group, topic, metrics.ResultOK),
		commits:   m.Commits.WithLabelValues(group),
		duration:  m.HandlerDuration.WithLabelValues(group, topic),
	}
}

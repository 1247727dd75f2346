package consumer

import (
	"context"
	"errors"
	"runtime/debug"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/internal/mutate"
)

// BatchConfig sizes the batches of Config.Batch.
type BatchConfig struct {
	// MaxMessages is the most messages in one transaction; 1 turns
	// batching off. Left 0, it is 0 (off) for a handler that handles one
	// message at a time, and 500 for a batch handler (handler.Batch), which
	// Run recognises: a batch handler batches unless told otherwise.
	// Default: 0 (off; 500 with a handler.Batch handler).
	MaxMessages int
	// MaxWait is how long a batch that is not full waits for more messages
	// once it has one.
	// Default: 0 (take what has been fetched; never wait).
	MaxWait time.Duration
	// MaxLatency is the latency budget of a batch: a batch closes when its
	// age (since its first message was taken) reaches MaxLatency, even if
	// MaxWait has not run out and it is not full; and a batch takes no more
	// messages than its handler is expected to get through within
	// MaxLatency, from the handler time per message of the worker's recent
	// batches (at least one message, at most MaxMessages). So a slow handler
	// gets smaller batches and each message waits for its commit about
	// MaxLatency at most, while a fast one keeps MaxMessages. Negative: no
	// budget (batches close only at MaxMessages or MaxWait).
	// Default: 50ms.
	MaxLatency time.Duration
}

// batch checks Config.Batch.
func (c configCheck) batch() {
	if c.Batch.MaxMessages < 0 || c.Batch.MaxMessages > 10000 {
		c.errs.Bad("Batch.MaxMessages", c.Batch.MaxMessages, "must be between 0 and 10000")
	}
	if c.Batch.MaxWait < 0 {
		c.errs.Bad("Batch.MaxWait", c.Batch.MaxWait, "must be >= 0")
	}
}

// work takes messages from src to their outcomes, one at a time or in
// batches, until src or the partition stops.
func (w *worker) work(src source) {
	var items []*batchItem
	b := batch{w}
	var next *sarama.ConsumerMessage // the first of the next batch: its route differs
	for {
		m := next
		if next = nil; m == nil {
			var ok bool
			if m, ok = src.pop(w.stopCtx); !ok {
				return
			}
		}
		if !w.r.routes.batches {
			if w.handle(m) != nil {
				return
			}
			continue
		}
		// Gather consecutive batchable messages of one route, within the
		// batch's size and latency budget (its route's
		// BatchConfig.MaxLatency); a message that is not batchable ends the
		// batch and is handled alone after it, one of another route ends it
		// and starts the next.
		items = items[:0]
		var alone *sarama.ConsumerMessage
		var bc BatchConfig
		var limit int
		var opened time.Time
		for {
			it, ok := b.prepare(m)
			switch {
			case !ok:
				alone = m
			case len(items) == 0:
				bc = it.rt.batch
				limit, opened = b.batchLimit(bc), time.Now()
				items = append(items, it)
			case it.rt != items[0].rt:
				next = m
			default:
				items = append(items, it)
			}
			if alone != nil || next != nil || len(items) >= limit {
				break
			}
			wait := bc.MaxWait
			if bc.MaxLatency > 0 && wait > 0 {
				if wait = min(wait, bc.MaxLatency-time.Since(opened)); wait <= 0 {
					break // the batch is as old as its budget: close it
				}
			}
			if m, ok = src.more(w.stopCtx, wait); !ok {
				break
			}
		}
		if len(items) > 0 {
			w.useRoute(items[0].rt)
			if b.handleBatch(items) != nil {
				return
			}
		}
		if alone != nil && w.handle(alone) != nil {
			return
		}
	}
}

// batchLimit is how many messages the next batch of a route batching with
// bc may take: MaxMessages, or fewer when the handler time per message of
// the worker's recent batches says more would not get through within
// MaxLatency.
func (w batch) batchLimit(bc BatchConfig) int {
	if bc.MaxLatency <= 0 || w.batchCost <= 0 {
		return bc.MaxMessages
	}
	return max(1, min(bc.MaxMessages, int(bc.MaxLatency/w.batchCost)))
}

// costed folds the time a successful batch of n messages took into the
// worker's handler time per message (an exponentially weighted average, so
// a handler that slows down or speeds up is followed within a few batches).
func (w batch) costed(d time.Duration, n int) {
	if n <= 0 {
		return
	}
	c := d / time.Duration(n)
	if w.batchCost == 0 {
		w.batchCost = c
		return
	}
	w.batchCost += (c - w.batchCost) / 4
}

// batch holds the steps of a worker's batches: their size, their
// transaction, and the way out of a failed one.
type batch struct{ *worker }

// batchItem is one message prepared for a batch.
type batchItem struct {
	cm  *sarama.ConsumerMessage
	msg *handler.Message
	rec dedupe.Record
	rt  *route // its route: a batch is of one route
	// limited: a deadline or a maximum age applies to it, so its expiry is
	// checked again right before the batch's handler call (anyExpired).
	limited bool
}

// prepare returns cm ready for a batch, or false when it must be handled
// alone: a retry-tier record (it may have to wait for its due time), a record
// Config.Filter skips or no route takes, one of a route that does not batch,
// a record without a valid key, an expired one (its route's Expiry),
// ordering mode, or a store without batches.
func (w batch) prepare(cm *sarama.ConsumerMessage) (*batchItem, bool) {
	r := w.r
	if r.order != nil || r.batchStore == nil || w.tier {
		return nil, false
	}
	msg := w.msgs.fresh(cm)
	msg.Attempt = 1
	if r.routes.filtered(msg, w.log) != "" {
		return nil, false
	}
	rt, _, err := r.routes.lookup(msg)
	if err != nil && rt == nil || rt == nil || rt.batch.MaxMessages <= 1 {
		return nil, false
	}
	w.useRoute(rt) // for its KeyFunc and Expiry
	o := origin{topic: cm.Topic, partition: cm.Partition, offset: cm.Offset}
	key, err := w.key(msg, o)
	if err != nil {
		return nil, false
	}
	msg.IdempotencyKey = key
	res := w.rt.expiryOf(msg)
	if res.Status != expiry.Live { // handleAfter dead-letters or drops it
		return nil, false
	}
	return &batchItem{cm: cm, msg: msg, rt: rt, limited: res.Limited, rec: dedupe.Record{Group: r.cfg.Group, Key: key, Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset,
		Epoch: r.ctl.epoch(msg, cm.Topic, cm.Partition, cm.Offset)}}, true // a re-drive's (control.go)
}

// handleBatch runs items in one transaction and marks them; on a failure it
// falls back to one transaction per message (see Config.Batch). errStopping
// means the partition is stopping.
func (w batch) handleBatch(items []*batchItem) error {
	r := w.r
	if !w.resumed() { // an operator pause holds the partition (control.go)
		return errStopping
	}
	probe, ok := r.gate.wait(w.stopCtx)
	if !ok {
		return errStopping
	}
	if probe { // the half-open probe is one message, not a batch
		r.gate.probeAbandoned()
		return w.alone(items, nil)
	}
	recs := make([]dedupe.Record, len(items))
	for i, it := range items {
		recs[i] = it.rec
	}
	// A batch is one handler attempt for Config.Limits.Adaptive: it takes
	// one slot, and its sample is its time per message (adaptive.go).
	slot, ok := r.lanes.acquire(w.stopCtx)
	if !ok {
		return errStopping
	}
	start := time.Now()
	var fresh []int
	failedAt := -1 // the item whose handler failed (per-message handler)
	outs, err := r.batchStore.ProcessBatch(w.ob.hctx, recs, func(ctx context.Context, idx []int) (err error) {
		fresh = idx
		if w.anyExpired(items, idx) {
			// A deadline or maximum age passed after prepare found the
			// message live, in a wait before this call (the breaker's gate,
			// an adaptive lane, the store's BEGIN, a transaction's hold;
			// the swarm: batches handled 14 s to a minute late): nothing
			// is called, and each message goes alone, where decide
			// dead-letters or drops an expired one and handles the rest.
			return errExpiredAtCall
		}
		ctx, span := w.ob.batchSpan(ctx, items, idx)
		defer func() { batchSpanEnd(span, err) }()
		if w.rt.bh != nil {
			msgs := make([]*handler.Message, len(idx))
			for j, i := range idx {
				msgs[j] = items[i].msg
			}
			w.steps.Key = "" // step.For names each message
			return callBatch(ctx, w.rt.bh, msgs)
		}
		for _, i := range idx {
			w.steps.Key = items[i].msg.IdempotencyKey
			if err := w.rt.h.Handle(ctx, items[i].msg); err != nil {
				failedAt = i
				return err
			}
		}
		return nil
	})
	r.lanes.release(slot, time.Since(start)/time.Duration(len(items)), err, func(err error) (class, error) { return r.classifyWith(err, w.rt.retry.Panics) })
	if err == nil {
		took := time.Since(start)
		w.costed(took, len(items))
		d := took.Seconds()
		for i, it := range items {
			if outs[i] == dedupe.Duplicate {
				w.mx.duplicate.Inc()
			} else {
				w.mx.processed.Inc()
				w.mx.attemptOK.Inc()
				w.mx.duration.Observe(d)
			}
			w.mark(it.cm)
		}
		return nil
	}
	if w.hctx.Err() != nil {
		r.m.Abandoned.WithLabelValues(r.cfg.Group).Add(float64(len(items)))
		return errStopping
	}
	if errors.Is(err, errExpiredAtCall) { // nothing was called: no failure to pin
		return w.alone(items, nil)
	}
	if w.debug {
		w.log.Debug("idem: batch failed; running its messages one by one", "messages", len(items), "new", len(fresh), "err", err)
	}
	if w.rt.bh != nil { // a batch handler's panic; a per-message one is logged when it runs alone
		w.ob.logPanic(err, items[0].msg)
	}
	firsts := make([]error, len(items))
	var be *handler.BatchError
	if errors.As(err, &be) {
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
	return w.alone(items, firsts)
}

// anyExpired reports whether the Expiry of the batch's route (in use: a
// batch is of one route) finds one of items[idx] expired now. Only items
// with a deadline or a maximum age are looked at: a batch without any
// reads no clock.
func (w batch) anyExpired(items []*batchItem, idx []int) bool {
	for _, i := range idx {
		if it := items[i]; w.rt.expiredAtCall(it.limited, it.msg) {
			return true
		}
	}
	return false
}

// alone is the way out of a failed batch, and of one in which a message
// expired while it waited (handleBatch): each message runs alone, one
// transaction each, in the batch's order, so nothing after a failing message
// commits before that message's own outcome (the order LaneBy promises). A
// non-nil firsts[i] is the failure the batch pinned on items[i] (the
// per-message handler failed on it, or a *handler.BatchError named it): it
// counts as that message's first attempt, so a permanent one goes to the DLQ
// without running again. A failure nobody can be blamed for pins nothing.
// errStopping means the partition is stopping.
func (w batch) alone(items []*batchItem, firsts []error) error {
	for i, it := range items {
		var first error
		if firsts != nil {
			first = firsts[i]
		}
		if err := w.handleAfter(it.cm, first); err != nil {
			return err
		}
	}
	return nil
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
	if mutate.On(mutate.Recover) {
		return h.HandleBatch(ctx, msgs)
	}
	defer func() {
		if v := recover(); v != nil {
			err = &handler.PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return h.HandleBatch(ctx, msgs)
}

// partMetrics are the collectors of one partition's hot path for one route,
// with their labels resolved once.
type partMetrics struct {
	processed, duplicate, attemptOK, commits interface{ Inc() }
	duration                                 interface{ Observe(float64) }
	route                                    string
}

// attempt counts a failed handler attempt by its result.
func (p partMetrics) attempt(m *coremetrics.Metrics, group, topic string, herr error) {
	result := coremetrics.ResultError
	switch {
	case isPanic(herr):
		result = coremetrics.ResultPanic
	case breaker.IsThrottled(herr): // before IsOpen, which holds for a throttle too
		result = coremetrics.ResultThrottled
	case breaker.IsOpen(herr):
		result = coremetrics.ResultBreakerOpen
	}
	m.Attempts.WithLabelValues(group, topic, p.route, result).Inc()
}

func newPartMetrics(m *coremetrics.Metrics, group, topic, route string) partMetrics {
	return partMetrics{
		processed: m.Messages.WithLabelValues(group, topic, route, coremetrics.OutcomeProcessed),
		duplicate: m.Messages.WithLabelValues(group, topic, route, coremetrics.OutcomeDuplicate),
		attemptOK: m.Attempts.WithLabelValues(group, topic, route, coremetrics.ResultOK),
		commits:   m.Commits.WithLabelValues(group),
		duration:  m.HandlerDuration.WithLabelValues(group, topic, route),
		route:     route,
	}
}

package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/internal/mutate"
)

// maxHandlerOutages bounds how often in a row one message may end an attempt
// with an outage-class error raised while its handler ran (its database
// connection dropped) while the store itself keeps working (BEGIN and the
// inbox INSERT succeed): then the message, not the database, is the likely
// cause, and the error is treated as an ordinary handler failure.
const maxHandlerOutages = 5

// process runs the attempts of one message: the handler in the dedupe store's
// unit of work, in-process retries with jittered backoff, waits through store
// outages and open breakers (neither counts as an attempt). failed is nil
// when the message is done (processed or duplicate), else the final error
// with which it must be forwarded; err is errStopping when the partition is
// stopping. Errors are classified by runner.classify. A non-nil first is the
// failure of the message's first attempt, made inside a batch that was rolled
// back: it counts as attempt 1.
func (w *worker) process(rec dedupe.Record, msg *handler.Message, first error) (failed, err error) {
	r := w.r
	v := verdicts{w}
	retries, outages, handlerOutages := 0, 0, 0
	for n := 0; ; n++ {
		if !w.resumed() { // an operator pause holds the partition (control.go)
			return nil, errStopping
		}
		waited := r.gate.closed.Load() // an open breaker: the wait may be long
		probe, ok := r.gate.wait(w.stopCtx)
		if !ok {
			return nil, errStopping
		}
		if (n > 0 || waited) && first == nil { // the message may have expired while it waited (a backoff, an outage, an open breaker, a throttle)
			if failed, done, err := v.expiredSince(rec, msg, probe); done {
				return failed, err
			}
		}
		var err error
		var ran bool
		if first != nil { // failed in a batch: that was this message's attempt
			err, ran, first = first, true, nil
			w.mx.attempt(r.m, r.cfg.Group, msg.Topic, err)
			w.ob.spanStart(msg)
		} else {
			slot, ok := r.lanes.acquire(w.stopCtx) // Config.Limits.Adaptive (adaptive.go); nil: no limit
			if !ok {
				if probe {
					r.gate.probeAbandoned()
				}
				return nil, errStopping
			}
			var took time.Duration
			ran, took, err = w.attempt(rec, msg)
			r.lanes.release(slot, took, err, r.classify)
		}
		if err != nil && w.hctx.Err() != nil {
			// Cancelled past the grace period: rolled back, left for redelivery.
			r.m.Abandoned.WithLabelValues(r.cfg.Group).Inc()
			w.ob.spanEnd(traceOutcomeAbandoned, err)
			if probe {
				r.gate.probeAbandoned() // cut short by revoke or shutdown: proves nothing
			}
			return nil, errStopping
		}
		c, err := r.classifyWith(err, w.rt.retry.Panics)
		if c == classExpired { // expired after its check, before its call: nothing ran
			if failed, done, err := v.expiredSince(rec, msg, probe); done {
				return failed, err
			}
			if probe {
				r.gate.probeAbandoned()
			}
			continue // live after all (the clock went back): try again
		}
		if c == classOutage && ran {
			if handlerOutages++; handlerOutages > maxHandlerOutages {
				w.log.Warn("idem: the handler lost its database connection on every try while the store works; treating it as a handler failure",
					"offset", msg.Offset, "key", rec.Key, "err", err, "tries", handlerOutages)
				c = classRetriable
			}
		} else if c == classOutage {
			handlerOutages = 0
		}
		if probe {
			// Anything but an open breaker opens the gate. A limit or a 429
			// of a dependency (breaker.IsThrottled) is not one: the gate
			// opens, and this message alone waits for that dependency
			// (throttleWait, below), as it would outside a probe.
			if c == classBreaker && !breaker.IsThrottled(err) {
				r.gate.trip(err)
				r.gate.probeDone(true)
				w.ob.spanEnd(traceOutcomeBreakerOpen, err)
				continue
			}
			r.gate.probeDone(false)
		}
		if c != classDone && c != classDeferred && c != classBreaker { // waiting for a dependency is no stall
			w.stall.failed(err)
		}
		switch {
		case c == classDone:
			return nil, nil
		case c == classDeferred: // not a failure: no retry spent; handleAfter stores it
			return err, nil
		case c == classFatal:
			w.ob.spanEnd(traceOutcomeAbandoned, err)
			r.fatal(err)
			return nil, errStopping
		case c == classOutage:
			outages++
			r.m.StoreErrors.WithLabelValues(r.cfg.Group).Inc()
			w.ob.spanEnd(traceOutcomeOutage, err)
			w.log.Warn("idem: database unavailable; retrying the same message", "offset", msg.Offset, "err", err, "try", outages)
			if !sleep(w.stopCtx, r.wait.outage(outages)) {
				return nil, errStopping
			}
		case c == classBreaker && breaker.IsThrottled(err):
			// A limit or a Retry-After of one dependency: only this message
			// waits for it (limits.go); nothing counts as a failure.
			w.ob.spanEnd(traceOutcomeBreakerOpen, err)
			if !w.throttleWait(err) {
				return nil, errStopping
			}
		case c == classBreaker:
			// The dependency is down: pause instead of spending retries.
			r.gate.trip(err)
			w.ob.spanEnd(traceOutcomeBreakerOpen, err)
		case c == classRetriable:
			d, again, rule := w.rt.retryWait(err, retries, r.wait) // rules.go: Config.Retry.Rules' attempts and backoff
			if !again {
				w.ob.spanError(err) // its forward ends the span
				return err, nil
			}
			retries++
			w.ob.spanEnd(traceOutcomeRetry, err)
			msg.Attempt++
			r.m.Retries.WithLabelValues(r.cfg.Group, msg.Topic, w.rt.name).Inc()
			if w.debug {
				w.log.Debug("idem: handler failed; retrying in process", "offset", msg.Offset, "key", rec.Key, "err", err, "retry", retries, "in", d, "rule", rule)
			}
			if !sleep(w.stopCtx, d) {
				return nil, errStopping
			}
		default:
			w.ob.spanError(err) // its forward ends the span
			return err, nil
		}
	}
}

// monoBase is the origin of attempt's start times: it has a monotonic
// reading, so durations from it read only the monotonic clock.
var monoBase = time.Now()

// attempt runs the handler once inside the dedupe store's unit of work; ran
// says whether the handler was called (the store got that far), took how
// long the store's unit of work took. Its two clock reads are the only ones
// of a processed message: a processed message's end time is w.ended, which
// its mark reads (mark). The start needs no wall clock, so it reads only the
// monotonic one (time.Since of monoBase: 27 ns here against time.Now's 50).
func (w *worker) attempt(rec dedupe.Record, msg *handler.Message) (ran bool, took time.Duration, err error) {
	r := w.r
	start := time.Since(monoBase)
	w.call = callState{msg: msg}
	out, err := r.cfg.Dedupe.Process(w.ob.spanStart(msg), rec, w.callFn)
	end := time.Now()
	took = end.Sub(monoBase) - start
	ran, herr := w.call.ran, w.call.err
	w.call = callState{}
	if err == nil && r.txn == nil && r.order == nil { // marked at once after (settle): no hold, no drain in between
		w.ended = end
	}
	topic := msg.Topic
	mx := w.mx
	if topic != w.tp.topic { // a parked message of another topic (ordering mode)
		mx = newPartMetrics(r.m, r.cfg.Group, topic, w.rt.name)
	}
	switch {
	case err == nil && out == dedupe.Duplicate:
		mx.duplicate.Inc()
		w.ob.spanEnd(traceOutcomeDuplicate, nil)
		if w.debug {
			w.log.Debug("idem: duplicate skipped", "offset", msg.Offset, "key", rec.Key)
		}
		return ran, took, nil
	case err == nil:
		mx.duration.Observe(took.Seconds())
		mx.attemptOK.Inc()
		mx.processed.Inc()
		w.ob.spanEnd(traceOutcomeProcessed, nil)
		return ran, took, nil
	}
	if herr != nil { // the handler ran and failed (err is herr, or wraps it)
		mx.duration.Observe(took.Seconds())
		mx.attempt(r.m, r.cfg.Group, topic, herr)
		w.ob.logPanic(herr, msg)
	}
	return ran, took, err
}

// logPanic logs a handler panic at ERROR with its stack: a panic is a bug to
// fix, whatever becomes of the message (retried with Retry.Panics, else
// dead-lettered).
func (o *observer) logPanic(err error, msg *handler.Message) {
	var pe *handler.PanicError
	if !errors.As(err, &pe) {
		return
	}
	o.log.Error("idem: handler panicked", "offset", msg.Offset, "key", msg.IdempotencyKey, "attempt", msg.Attempt,
		"panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
}

// retriable reports whether err may be retried under rt's policies: a
// panic only with its Retry.Panics, another error when handler.IsRetriable.
func (rt *route) retriable(err error) bool {
	if isPanic(err) {
		return rt.retry.Panics
	}
	return handler.IsRetriable(err)
}

// expiredSince ends the attempts of msg when Config.Expiry finds it expired
// now (its deadline or its maximum age passed between two attempts, or
// before the call), as decide does before the first: done is true, and
// failed is the error to dead-letter it with, or nil when it is dropped
// (expire: counted, its OnExpired run or owed) or when an earlier
// delivery's outcome stands (earlier: another copy, a redelivery on
// another member after a rebalance, was applied while this one waited, or
// this delivery was deferred before and its deferred copy has the
// outcome: a duplicate, as decide finds before the first attempt, not
// dead-lettered as expired); err is errStopping when the
// partition is stopping. probe gives the gate's probe slot back: no call
// proved anything.
func (w verdicts) expiredSince(rec dedupe.Record, msg *handler.Message, probe bool) (failed error, done bool, err error) {
	res := w.rt.expiryOf(msg)
	if res.Status == expiry.Live || mutate.On(mutate.Expiry) {
		return nil, false, nil
	}
	if probe {
		w.r.gate.probeAbandoned()
	}
	if !mutate.On(mutate.Decide) {
		seen, err := w.earlier(rec, msg)
		if err != nil {
			return nil, true, err
		}
		if seen {
			mx := w.mx
			if msg.Topic != w.tp.topic { // a parked message of another topic (ordering mode)
				mx = newPartMetrics(w.r.m, w.r.cfg.Group, msg.Topic, w.rt.name)
			}
			mx.duplicate.Inc()
			w.ob.spanEnd(traceOutcomeDuplicate, nil)
			return nil, true, nil
		}
	}
	failed, drop, stop := w.expire(msg, msg.Topic, res)
	if stop != nil {
		return nil, true, stop
	}
	if drop {
		failed = nil
	}
	return failed, true, nil
}

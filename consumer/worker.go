package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/internal/mutate"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/wire"
)

// worker takes the messages of one lane (or of the whole claim) to their
// outcomes, one at a time or in batches. Its state is its own; what it shares
// with the claim's other workers it reaches through claim.
//
// One message, from fetch to mark, one file per step: claim.go (the reader
// fills the claim's queue; dispatch to a lane), batch.go (work: alone or in
// a batch), worker.go (handleAfter: the steps of one message), keys.go (its
// idempotency key), ordering.go (keyOrder: parked behind its key's head?),
// process.go (dedupe store + handler, in-process retries, outages,
// breakers), forward.go (forward: retry tier or dead-letter topic, and where
// it went), then worker.mark (the offset, through the claim's tracker).
//
// The worker keeps the path and the state of the message in hand. A
// feature's steps are a stage of their own, a struct holding only the
// worker, with the methods of that feature: routing (routes, the filter),
// verdicts (an earlier delivery's outcome, expiry), batch, byKey
// (ordering) and orderingClaim (its takeover of a claimed partition),
// deferrals, hookCalls (the user's hooks), txnHold (the
// transaction hold) and ackedSend. The next feature adds a stage, not
// methods on worker.
type worker struct {
	*claim

	rt *route      // the route of the message in hand (useRoute)
	mx partMetrics // its collectors

	stall *stall   // how long this worker's head message has been failing
	msgs  messages // the Messages it hands its handler (message.go)
	ob    observer // this worker's spans, and the logs and metrics that go with them

	batchCost time.Duration // recent handler time per batched message (batchLimit)

	// steps is what package step finds in the handler's ctx (steps.go).
	steps tables.StepScope

	// call is the attempt in progress and callFn the function the store
	// runs for it, bound once per worker so an attempt allocates no closure.
	call   callState
	callFn func(ctx context.Context) error

	// staged are the forwards decided for the message in hand, and owed the
	// hooks they owe (Transactions: sent and run when it settles, settle.go).
	staged []staged
	owed   []owedHook

	// limited: decide found a deadline or a maximum age on the message in
	// hand, so callHandler checks its expiry again right before the call,
	// after whatever waits came between (classExpired).
	limited bool
	// deferral is the identity of the delivery in hand's deferral
	// (deferralOf; "" for none), set by decide for expiredSince's lookups.
	deferral string

	// ended is when the attempt of the message in hand ended processed or
	// duplicate, when it is marked right after (attempt); zero otherwise.
	// Its mark takes it as now, saving a clock read.
	ended time.Time

	// keyed: a record of the claim's topic had a key, so keyWatch has
	// decided the topic (worker.key).
	keyed bool
}

// observer is a worker's instrumentation: the attempt span of the message
// the worker is taking to an outcome, and the logs and metrics of the steps
// that end one (forwarded, a panic). One per worker, so its state needs no
// lock.
type observer struct {
	r        *runner
	log      *slog.Logger
	tp       tp
	hctx     context.Context // the claim's handler ctx: the root of every span
	tspan    spanState       // the open attempt span (tracing.go)
	route    string          // the route of the message in hand: the route label
	unprobed int             // untraced messages since the last span started with a non-recording tracer

	// rootTraced: rootOf, the hctx it was found for, carries a valid span
	// context (traced).
	rootOf     context.Context
	rootTraced bool
}

// callState is one attempt's message and what became of its handler call.
type callState struct {
	msg *handler.Message
	ran bool
	err error
}

// callHandler runs the handler for w.call.msg; it is w.callFn.
func (w *worker) callHandler(ctx context.Context) error {
	if w.rt.expiredAtCall(w.limited, w.call.msg) {
		return errExpiredAtCall // the store rolls back; process ends the message as expired
	}
	w.call.ran = true
	w.steps.Key = w.call.msg.IdempotencyKey // the message whose steps this call records
	w.call.err = w.rt.h.Handle(ctx, w.call.msg)
	return w.call.err
}

// mark records m's outcome as final: its offset is marked for commit at
// once, or through the tracker once every earlier message is final. With
// Transactions it runs inside settle's hold when m's forwards are staged.
func (w *worker) mark(m *sarama.ConsumerMessage) {
	if w.redo { // a re-drive's record (control.go): its progress is the re-drive's, not the group's offset
		w.stall.clear()
		return
	}
	if w.track != nil {
		w.track.finish(m.Offset)
	} else {
		w.markOffset(m.Offset + 1)
	}
	w.mx.commits.Inc()
	now := w.ended
	if w.ended = (time.Time{}); now.IsZero() {
		now = time.Now()
	}
	w.obs.marked(m, now)
	w.stall.clear()
}

// errStopping is the one error a stopping worker returns, from every step:
// the claim was revoked, the session ended or Run is shutting down. The
// message in hand is not marked and is redelivered to the partition's next
// owner.
var errStopping = errors.New("consumer: partition stopping")

// handle takes m to a final outcome and marks it, or returns errStopping
// when the partition is stopping and m must be left for redelivery.
func (w *worker) handle(cm *sarama.ConsumerMessage) error { return w.handleAfter(cm, nil) }

// handleAfter is handle for a message whose first attempt already failed
// with first (inside a batch that was rolled back): that failure counts as
// its first attempt. first nil is handle.
func (w *worker) handleAfter(cm *sarama.ConsumerMessage, first error) error {
	r := w.r
	defer w.drop() // what a message left unsettled (stopping) staged
	a := w.msgs.reuse(cm)
	msg := &a.m
	w.ended = time.Time{}
	if mutate.On(mutate.MarkEarly) && w.track == nil {
		w.markOffset(cm.Offset + 1)
	}
	origin := origin{topic: cm.Topic, partition: cm.Partition, offset: cm.Offset}
	if w.tier { // only records of this group's retry tiers carry an origin to decode
		origin = r.originOf(cm)
	}
	msg.Attempt = origin.attempts + 1
	if origin.topic != cm.Topic { // a tier record, or a deferred copy
		msg.Original = handler.Origin{Topic: origin.topic, Partition: origin.partition, Offset: origin.offset, Timestamp: origin.prior.OriginalTimestamp}
	}
	if err := w.waitDue(cm, origin); err != nil {
		return err
	}
	w.ob.traceMessage(msg, origin.tier)
	defer w.ob.spanEnd(traceOutcomeAbandoned, nil) // any span still open: cut short
	src := wire.Source{Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset, Timestamp: cm.Timestamp, Group: r.cfg.Group}
	if done, err := (routing{w}).routeMessage(cm, msg, src, origin); done || err != nil { // route.go: filtered, unmatched, or its route in use
		return err
	}

	key, keyErr := w.key(msg, origin)
	if keyErr == errStopping {
		return keyErr
	}
	if keyErr != nil {
		r.m.MissingKey.WithLabelValues(r.cfg.Group, cm.Topic, w.rt.name).Inc()
		if _, err := w.forward(w.failure(src, cm.Key, cm.Value, cm.Headers, origin, msg, keyErr), msg); err != nil {
			return err
		}
		return w.settle(cm)
	}
	msg.IdempotencyKey = key
	ord := w.orderOf(cm)
	rec := dedupe.Record{Group: r.cfg.Group, Key: key, Topic: origin.topic, Partition: origin.partition, Offset: origin.offset,
		Epoch: r.ctl.epoch(msg, origin.topic, origin.partition, origin.offset)} // a re-drive's (control.go)
	var deferral string // only Config.Defer stores deferrals: no string built per message without it
	if r.cfg.Defer != nil {
		deferral = deferralOf(cm.Topic, cm.Partition, cm.Offset)
	}
	// Once a tier record is due, before parking, before the handler: an
	// earlier delivery's outcome stands, else expiry (decide.go).
	d, err := verdicts{w}.decide(rec, msg, deferral)
	if err != nil {
		return err
	}
	if d.earlier { // applied or deferred before: a duplicate
		w.mx.duplicate.Inc()
		w.ob.spanEnd(traceOutcomeDuplicate, nil)
		if err := ord.settled(origin, cm.Key, key, cm.Offset); err != nil {
			return err
		}
		return w.msgs.keepAfter(a, w.settle(cm))
	}
	expired := d.res.Status != expiry.Live
	// An expired message is never parked, but a copy of one the ordering
	// store holds already (a redelivery) is skipped all the same: the
	// stored one has its turn, and is dead-lettered then, once.
	parked, err := ord.admit(cm, msg, origin, expired)
	if err != nil {
		return err
	}
	if parked {
		r.m.Messages.WithLabelValues(r.cfg.Group, cm.Topic, w.rt.name, coremetrics.OutcomeParked).Inc()
		return w.settle(cm)
	}
	var failed error
	owed := len(w.owed) // an OnExpired owed to the transaction keeps msg (process may expire it too)
	if expired {
		var drop bool
		var stop error
		if failed, drop, stop = (verdicts{w}).expire(msg, cm.Topic, d.res); stop != nil {
			return stop
		}
		if drop {
			failed = nil
		}
	} else if failed, err = w.process(rec, msg, first); err != nil {
		return err
	}
	processed := !expired && failed == nil && len(w.owed) == owed // nothing keeps msg: reusable once marked
	if failed != nil {
		var stop error
		if failed, stop = w.deferred(msg, failed, deferral); stop != nil { // handler.DeferUntil: stored, then settled and marked
			return stop
		}
	}
	if failed != nil {
		f := w.failure(src, cm.Key, cm.Value, cm.Headers, origin, msg, failed)
		if f.tier > 0 {
			if err := ord.toTier(origin, cm.Key, key, f.tier); err != nil {
				return err
			}
		}
		sent, err := w.forward(f, msg)
		if err != nil {
			return err
		}
		if sent.tier > 0 { // in a tier: it comes back; a tier refusing it for good dead-letters it
			return w.settle(cm)
		}
	}
	// Processed, duplicate or dead-lettered: the key's parked messages follow.
	if err := ord.settled(origin, cm.Key, key, cm.Offset); err != nil {
		return err
	}
	if processed {
		return w.msgs.keepAfter(a, w.settle(cm))
	}
	return w.settle(cm)
}

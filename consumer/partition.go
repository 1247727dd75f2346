package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/retrytopic"
)

// partition is the pipeline of one claimed partition: its worker (the
// ConsumeClaim goroutine) handles its messages in order, one at a time or in
// batches; with Config.Concurrency > 1 it dispatches them to lanes instead,
// each lane a worker over a view of the partition with a stall of its own.
type partition struct {
	r     *runner
	sess  sarama.ConsumerGroupSession
	claim sarama.ConsumerGroupClaim
	tp    tp
	log   *slog.Logger
	debug bool // log at DEBUG: checked before building debug attributes
	tier  bool // the topic is a retry tier, not a source topic
	mx    partMetrics
	obs   *partObs // end-to-end latency and in-flight messages, shared with the views

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
	// views are the lanes' views of the partition (Concurrency > 1).
	views []*partition

	stall   *stall           // how long this worker's head message has been failing
	stalls  []*stall         // every worker's stall (the partition's and its lanes')
	stalled prometheus.Gauge // idem_partition_stalled_seconds of this partition

	bp *bpState // back-pressure, shared with the views

	names map[string]string // this worker's header-name cache (see newMessage)

	tspan    spanState // this worker's open attempt span (tracing.go)
	unprobed int       // untraced messages since the last span started with a non-recording tracer

	batchCost time.Duration // this worker's recent handler time per batched message (batchLimit)

	// call is the attempt in progress and callFn the function the store
	// runs for it, bound once per worker so an attempt allocates no closure.
	call   callState
	callFn func(ctx context.Context) error
}

// callState is one attempt's message and what became of its handler call.
type callState struct {
	msg *handler.Message
	ran bool
	err error
}

// callHandler runs the handler for p.call.msg; it is p.callFn.
func (p *partition) callHandler(ctx context.Context) error {
	p.call.ran = true
	p.call.err = p.r.h.Handle(ctx, p.call.msg)
	return p.call.err
}

// bpState is whether a partition's fetching is paused by back-pressure.
type bpState struct {
	mu sync.Mutex  // serialises transitions
	on atomic.Bool // fast-path read
}

func newPartition(r *runner, s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) *partition {
	p := &partition{
		r: r, sess: s, claim: c,
		tp:    tp{c.Topic(), c.Partition()},
		log:   r.log.With("topic", c.Topic(), "partition", c.Partition()),
		debug: r.log.Enabled(context.Background(), slog.LevelDebug),
		tier:  !slices.Contains(r.cfg.Topics, c.Topic()),
		mx:    newPartMetrics(r.m, r.cfg.Group, c.Topic()),
		obs:   newPartObs(r, c.Topic()),
		stall: &stall{},
		bp:    &bpState{},
		names: map[string]string{},
	}
	p.callFn = p.callHandler
	p.stalls = []*stall{p.stall}
	p.stopCtx, p.stop = context.WithCancel(r.baseCtx)
	p.hctx, p.hcancel = context.WithCancel(r.baseCtx)
	if r.cfg.Concurrency > 1 || r.cfg.Batch.MaxMessages > 1 {
		p.track = newTracker(p)
	}
	if n := r.cfg.Concurrency; n > 1 {
		for range n {
			v := &partition{}
			*v = *p // a view shares everything but its stall
			v.stall = &stall{}
			v.names = map[string]string{}
			v.callFn = v.callHandler
			p.views = append(p.views, v)
			p.stalls = append(p.stalls, v.stall)
		}
	}
	return p
}

// backpressure pauses or resumes fetching when the queue crosses its marks;
// the transition is taken under bpMu so pause and resume cannot cross.
func (p *partition) backpressure(on bool) {
	if p.bp.on.Load() == on {
		return
	}
	p.bp.mu.Lock()
	defer p.bp.mu.Unlock()
	if p.bp.on.Load() != on {
		p.r.pauses.set(p.tp, pauseBackpressure, on)
		p.bp.on.Store(on)
	}
}

// run handles the claim until it ends. It marks an offset only after the
// message's outcome is durable and only before it returns, so never after the
// claim is lost.
func (p *partition) run() {
	r := p.r
	q := newQueue()
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		p.stop()
		p.hcancel()
		wg.Wait()
		r.gate.leave(p.tp)
		r.pauses.forget(p.tp)
	}()
	r.gate.join(p.tp)
	defer r.register(p)()

	// The reader drains Messages so that its closing (revocation) is seen at
	// once, and pauses fetching when the worker falls behind.
	wg.Go(func() {
		defer p.stop()
		for {
			select {
			case m, ok := <-p.claim.Messages():
				if !ok {
					return
				}
				if q.push(m) {
					p.backpressure(true)
				}
			case <-p.sess.Context().Done():
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
		case <-p.stopCtx.Done():
		case <-done:
			return
		}
		t := time.NewTimer(r.cfg.ShutdownGrace)
		defer t.Stop()
		select {
		case <-t.C:
			p.log.Warn("idem: in-flight message exceeded the shutdown grace; cancelling it", "grace", r.cfg.ShutdownGrace)
			p.hcancel()
		case <-done:
		}
	})

	// The reader runs before anything else, so a revoke stops the claim's
	// recovery of pending ordering forwards at once, too.
	if r.order != nil && !p.claimOrdering() {
		return
	}
	if len(p.views) > 0 {
		p.lanes(q)
		return
	}
	p.work(queueSource{p, q})
}

// mark records m's outcome as final: its offset is marked for commit at
// once, or through the tracker once every earlier message is final.
func (p *partition) mark(m *sarama.ConsumerMessage) {
	if p.track != nil {
		p.track.finish(m.Offset)
	} else {
		p.sess.MarkMessage(m, "")
	}
	p.mx.commits.Inc()
	p.obs.marked(m)
	p.stall.clear()
}

// handle takes m to a final outcome and marks it, or returns false when the
// partition is stopping and m must be left for redelivery.
func (p *partition) handle(cm *sarama.ConsumerMessage) bool { return p.handleAfter(cm, nil) }

// handleAfter is handle for a message whose first attempt already failed
// with first (inside a batch that was rolled back): that failure counts as
// its first attempt. first nil is handle.
func (p *partition) handleAfter(cm *sarama.ConsumerMessage, first error) bool {
	r := p.r
	msg := p.message(cm)
	origin := origin{topic: cm.Topic, partition: cm.Partition, offset: cm.Offset}
	if p.tier { // only records of this group's retry tiers carry an origin to decode
		origin = r.originOf(cm)
	}
	msg.Attempt = origin.attempts + 1
	if origin.tier > 0 {
		msg.Original = handler.Origin{Topic: origin.topic, Partition: origin.partition, Offset: origin.offset, Timestamp: origin.prior.OriginalTimestamp}
	}
	if !p.waitDue(cm, origin) {
		return false
	}
	p.traceMessage(msg, origin.tier)
	defer p.spanEnd(TraceOutcomeAbandoned, nil) // any span still open: cut short
	src := retrytopic.Source{Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset, Timestamp: cm.Timestamp, Group: r.cfg.Group}

	key, keyErr := p.key(msg, origin)
	if keyErr != nil {
		r.m.MissingKey.WithLabelValues(r.cfg.Group, cm.Topic).Inc()
		if !p.send(p.failure(src, cm.Key, cm.Value, cm.Headers, origin, msg, keyErr), msg) {
			return false
		}
		p.mark(cm)
		return true
	}
	msg.IdempotencyKey = key
	ordered := r.order != nil && len(cm.Key) > 0
	if ordered {
		parked, ok := p.park(cm, msg, origin)
		if !ok {
			return false
		}
		if parked {
			r.m.Messages.WithLabelValues(r.cfg.Group, cm.Topic, metrics.OutcomeParked).Inc()
			p.mark(cm)
			return true
		}
	}
	rec := dedupe.Record{Group: r.cfg.Group, Key: key, Topic: origin.topic, Partition: origin.partition, Offset: origin.offset}
	err, ok := p.process(rec, msg, first)
	if !ok {
		return false
	}
	if err != nil {
		f := p.failure(src, cm.Key, cm.Value, cm.Headers, origin, msg, err)
		if ordered && f.tier > 0 && !p.orderStep(func(ctx context.Context) error {
			return r.order.BlockTier(ctx, origin.topic, cm.Key, key, f.tier)
		}) {
			return false
		}
		sent, ok := p.forward(f, msg)
		if !ok {
			return false
		}
		if ordered && sent.tier > 0 { // a tier refusing it for good dead-letters it: then drain
			p.mark(cm)
			return true
		}
	}
	// Processed, duplicate or dead-lettered: the key's parked messages follow.
	if ordered && !p.drain(origin.topic, cm.Key, key) {
		return false
	}
	p.mark(cm)
	return true
}

// maxHandlerOutages bounds how often in a row one message may end an attempt
// with an outage-class error raised while its handler ran (its database
// connection dropped) while the store itself keeps working (BEGIN and the
// inbox INSERT succeed): then the message, not the database, is the likely
// cause, and the error is treated as an ordinary handler failure.
const maxHandlerOutages = 5

// process runs the attempts of one message: the handler in the dedupe store's
// unit of work, in-process retries with jittered backoff, waits through store
// outages and open breakers (neither counts as an attempt). It returns nil when
// the message is done (processed or duplicate), the final error when it must be
// forwarded, or ok=false when the partition is stopping. Errors are classified
// by runner.classify. A non-nil first is the failure of the message's first
// attempt, made inside a batch that was rolled back: it counts as attempt 1.
func (p *partition) process(rec dedupe.Record, msg *handler.Message, first error) (err error, ok bool) {
	r := p.r
	retries, outages, handlerOutages := 0, 0, 0
	for {
		probe, ok := r.gate.wait(p.stopCtx)
		if !ok {
			return nil, false
		}
		var err error
		var ran bool
		if first != nil { // failed in a batch: that was this message's attempt
			err, ran, first = first, true, nil
			p.mx.attempt(r.m, r.cfg.Group, msg.Topic, err)
			p.spanStart(msg)
		} else {
			err, ran = p.attempt(rec, msg)
		}
		if err != nil && p.hctx.Err() != nil {
			// Cancelled past the grace period: rolled back, left for redelivery.
			r.m.Abandoned.WithLabelValues(r.cfg.Group).Inc()
			p.spanEnd(TraceOutcomeAbandoned, err)
			if probe {
				r.gate.probeAbandoned() // cut short by revoke or shutdown: proves nothing
			}
			return nil, false
		}
		c, err := r.classify(err)
		if c == classOutage && ran {
			if handlerOutages++; handlerOutages > maxHandlerOutages {
				p.log.Warn("idem: the handler lost its database connection on every try while the store works; treating it as a handler failure",
					"offset", msg.Offset, "key", rec.Key, "err", err, "tries", handlerOutages)
				c = classRetriable
			}
		} else if c == classOutage {
			handlerOutages = 0
		}
		if probe {
			if c == classBreaker {
				r.gate.trip(err)
				r.gate.probeDone(true)
				p.spanEnd(TraceOutcomeBreakerOpen, err)
				continue
			}
			r.gate.probeDone(false)
		}
		if c != classDone {
			p.stall.failed(err)
		}
		switch {
		case c == classDone:
			return nil, true
		case c == classFatal:
			p.spanEnd(TraceOutcomeAbandoned, err)
			r.fatal(err)
			return nil, false
		case c == classOutage:
			outages++
			r.m.StoreErrors.WithLabelValues(r.cfg.Group).Inc()
			p.spanEnd(TraceOutcomeOutage, err)
			p.log.Warn("idem: database unavailable; retrying the same message", "offset", msg.Offset, "err", err, "try", outages)
			if !sleep(p.stopCtx, r.outageDelay(outages)) {
				return nil, false
			}
		case c == classBreaker:
			// The dependency is down: pause instead of spending retries.
			r.gate.trip(err)
			p.spanEnd(TraceOutcomeBreakerOpen, err)
		case c == classRetriable && retries < r.cfg.Retries:
			d := r.jitter(retries + 1)
			if ra, ok := handler.RetryAfterOf(err); ok && ra > d {
				if ra > r.cfg.RetryMax && len(r.policy.Delays) > 0 {
					// Too long to hold the partition: the retry tier honours it
					// (capped at its delay) without blocking later messages.
					p.spanError(err)
					return err, true
				}
				d = ra
			}
			retries++
			p.spanEnd(TraceOutcomeRetry, err)
			msg.Attempt++
			r.m.Retries.WithLabelValues(r.cfg.Group, msg.Topic).Inc()
			if p.debug {
				p.log.Debug("idem: handler failed; retrying in process", "offset", msg.Offset, "key", rec.Key, "err", err, "retry", retries, "in", d)
			}
			if !sleep(p.stopCtx, d) {
				return nil, false
			}
		default:
			p.spanError(err) // its forward ends the span
			return err, true
		}
	}
}

// attempt runs the handler once inside the dedupe store's unit of work; ran
// says whether the handler was called (the store got that far).
func (p *partition) attempt(rec dedupe.Record, msg *handler.Message) (err error, ran bool) {
	r := p.r
	start := time.Now()
	p.call = callState{msg: msg}
	out, err := r.cfg.Dedupe.Process(p.spanStart(msg), rec, p.callFn)
	ran, herr := p.call.ran, p.call.err
	p.call = callState{}
	topic := msg.Topic
	mx := p.mx
	if topic != p.tp.topic { // a parked message of another topic (ordering mode)
		mx = newPartMetrics(r.m, r.cfg.Group, topic)
	}
	switch {
	case err == nil && out == dedupe.Duplicate:
		mx.duplicate.Inc()
		p.spanEnd(TraceOutcomeDuplicate, nil)
		if p.debug {
			p.log.Debug("idem: duplicate skipped", "offset", msg.Offset, "key", rec.Key)
		}
		return nil, ran
	case err == nil:
		mx.duration.Observe(time.Since(start).Seconds())
		mx.attemptOK.Inc()
		mx.processed.Inc()
		p.spanEnd(TraceOutcomeProcessed, nil)
		return nil, ran
	}
	if herr != nil { // the handler ran and failed (err is herr, or wraps it)
		mx.duration.Observe(time.Since(start).Seconds())
		mx.attempt(r.m, r.cfg.Group, topic, herr)
		p.logPanic(herr, msg)
	}
	return err, ran
}

// logPanic logs a handler panic at ERROR with its stack: a panic is a bug to
// fix, whatever becomes of the message (retried with RetryPanics, else
// dead-lettered).
func (p *partition) logPanic(err error, msg *handler.Message) {
	var pe *handler.PanicError
	if !errors.As(err, &pe) {
		return
	}
	p.log.Error("idem: handler panicked", "offset", msg.Offset, "key", msg.IdempotencyKey, "attempt", msg.Attempt,
		"panic", fmt.Sprint(pe.Value), "stack", string(pe.Stack))
}

func (p *partition) retriable(err error) bool {
	if handler.IsPanic(err) {
		return p.r.cfg.RetryPanics
	}
	return handler.IsRetriable(err)
}

// key derives and checks the idempotency key. It is checked before any
// database call: a key the inbox cannot store, or that would make a poor
// identifier, follows the MissingKey policy with kind invalid-key; a KeyFunc
// error marked handler.Decode (a value that is not JSON under JSONField)
// follows it with kind decode, any other with kind missing-key.
func (p *partition) key(msg *handler.Message, o origin) (string, error) {
	r := p.r
	k, err := callKeyFunc(r.cfg.KeyFunc, msg)
	if err != nil && !handler.IsDecode(err) { // a record that does not decode keeps kind decode
		err = &handler.MissingKeyError{Reason: "KeyFunc: " + err.Error()}
	} else if err == nil {
		err = checkKey(k, r.cfg.MaxKeyLength)
	}
	if o.tier == 0 && !p.tier && r.keys.observe(o.topic, o.partition, o.offset, err) {
		r.warnNoKeys(o.topic, err)
	}
	if err == nil {
		return k, nil
	}
	if r.cfg.MissingKey == MissingKeyUseCoordinates {
		return o.topic + "/" + strconv.Itoa(int(o.partition)) + "/" + strconv.FormatInt(o.offset, 10), nil
	}
	return "", err
}

// checkKey validates an idempotency key: not empty, at most max bytes, valid
// UTF-8 and free of NUL bytes (PostgreSQL text rejects both, SQLSTATE 22021).
// The error is a *handler.MissingKeyError; Invalid is set for a key that is
// present but unusable.
func checkKey(k string, max int) error {
	switch {
	case k == "":
		return &handler.MissingKeyError{Reason: "empty or absent"}
	case len(k) > max:
		return &handler.MissingKeyError{Reason: fmt.Sprintf("%d bytes, longer than MaxKeyLength %d", len(k), max), Invalid: true}
	case !utf8.ValidString(k):
		return &handler.MissingKeyError{Reason: "not valid UTF-8", Invalid: true}
	case strings.IndexByte(k, 0) >= 0:
		return &handler.MissingKeyError{Reason: "contains a NUL byte", Invalid: true}
	}
	return nil
}

// callKeyFunc calls f, turning a panic into an error: a KeyFunc that panics
// on one bad payload must not take the consumer down.
func callKeyFunc(f KeyFunc, msg *handler.Message) (k string, err error) {
	defer func() {
		if v := recover(); v != nil {
			k, err = "", fmt.Errorf("panic: %v", v)
		}
	}()
	return f(msg)
}

// toMessage converts a sarama record; the Message shares its byte slices.
func toMessage(cm *sarama.ConsumerMessage) *handler.Message { return newMessage(cm, nil) }

// message is toMessage with header names interned in the worker's cache.
func (p *partition) message(cm *sarama.ConsumerMessage) *handler.Message {
	return newMessage(cm, p.names)
}

// messageAlloc holds a Message and room for its first headers, so that a
// record with few headers costs one allocation.
type messageAlloc struct {
	m  handler.Message
	hs [4]handler.Header
}

// maxNames bounds a worker's cache of header names.
const maxNames = 64

// newMessage converts cm. Header names are looked up in names (when not nil)
// so the common ones ("idempotency-key", idem-*) are not copied per record.
func newMessage(cm *sarama.ConsumerMessage, names map[string]string) *handler.Message {
	a := &messageAlloc{m: handler.Message{
		Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset,
		Key: cm.Key, Value: cm.Value, Timestamp: cm.Timestamp,
		Original: handler.Origin{Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset, Timestamp: cm.Timestamp},
	}}
	hs := a.hs[:0]
	if len(cm.Headers) > len(a.hs) {
		hs = make([]handler.Header, 0, len(cm.Headers))
	}
	for _, h := range cm.Headers {
		if h == nil {
			continue
		}
		name, ok := names[string(h.Key)] // no allocation for the lookup
		if !ok {
			name = string(h.Key)
			if names != nil && len(names) < maxNames {
				names[name] = name
			}
		}
		hs = append(hs, handler.Header{Key: name, Value: h.Value})
	}
	a.m.Headers = hs
	return &a.m
}

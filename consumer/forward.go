package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/mutate"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// origin says where a record was first consumed and what its idem-* headers
// say about earlier failures. For a record from the source topic it is the
// record's own coordinates and a zero prior.
type origin struct {
	topic     string
	partition int32
	offset    int64
	tier      int // the retry tier the record was read from; 0 for a source topic
	prior     retrytopic.Failure
	attempts  int // deliveries before this one
}

// originOf decodes cm's idem-* headers. A record carries them when it was
// read from one of this group's retry tiers; headers that do not decode, or
// that belong to another group, are ignored (the record is then treated as
// fresh: safe, because the inbox still dedupes by key).
func (r *runner) originOf(cm *sarama.ConsumerMessage) origin {
	o := origin{topic: cm.Topic, partition: cm.Partition, offset: cm.Offset}
	f, ok, err := wire.Decode(cm.Headers)
	if !ok || err != nil || f.Group != r.cfg.Group || f.OriginalTopic == "" {
		return o
	}
	if d, ok := r.deferredOrigin(cm, f); ok { // a deferred copy (deferral.go)
		return d
	}
	if f.Tier < 1 {
		return o
	}
	if n, _, ok := r.routes.tierOf(f.OriginalTopic, r.cfg.Group, cm.Topic); !ok || n != f.Tier {
		return o
	}
	o.topic, o.partition, o.offset = f.OriginalTopic, f.OriginalPartition, f.OriginalOffset
	o.tier, o.prior, o.attempts = f.Tier, f, f.Attempt
	return o
}

// dueSlack is how far past its tier's delay from now a record's idem-due-at
// may lie before waitDue stops trusting it (clock skew between hosts, the
// millisecond rounding).
const dueSlack = time.Second

// waitDue holds a retry record until its idem-due-at: only this partition
// waits, and the wait ends at once when the claim is revoked. The wait is
// bounded: a due time further out than the tier's delay from now (written by
// another version, a changed policy, or a skewed clock) is waited for only up
// to that delay (plus dueSlack), with a WARN, so one record cannot hold a tier
// partition for long. errStopping: the partition is stopping.
func (c *claim) waitDue(cm *sarama.ConsumerMessage, o origin) error {
	if o.tier == 0 || o.prior.DueAt.IsZero() {
		return nil
	}
	due := o.prior.DueAt
	if _, delay, ok := c.r.routes.tierOf(o.topic, c.r.cfg.Group, cm.Topic); ok { // the delay of its own ladder's tier
		if bound := time.Now().Add(delay + dueSlack); due.After(bound) {
			c.log.Warn("idem: retry record due later than its tier's delay; waiting only the delay",
				"topic", cm.Topic, "offset", cm.Offset, "due_at", due, "delay", delay)
			due = bound
		}
	}
	if err := forward.WaitDue(c.stopCtx, due, nil); err != nil {
		return errStopping
	}
	c.r.m.RetryDelay.WithLabelValues(c.r.cfg.Group, cm.Topic).Observe(time.Since(o.prior.DueAt).Seconds())
	return nil
}

// outbound is a failed message on its way to a retry tier or the DLQ.
type outbound struct {
	rec  forward.Record
	tier int // 0: the dead-letter topic
	kind string
	f    retrytopic.Failure // what rec's idem-* headers say
	dlq  string             // the dead-letter topic of the record's family
	stub bool               // rec is a stub: its value was left out
}

// failure decides where a failed message goes: to the next retry tier when
// its error is retriable and tiers remain, else to the dead-letter topic; and
// builds the record: key, value and original headers unchanged, idem-* headers
// set. src is where it was read (a source or a tier), o its origin.
//
// A tier's due time is the failure plus the tier's delay. A
// handler.RetryAfter is capped at that delay, so it never moves the due time:
// due times in a tier partition stay in write order and no record holds a
// tier partition longer than the tier's delay (retrytopic.Policy.Delays).
func (w *worker) failure(src wire.Source, key, value []byte, headers []*sarama.RecordHeader, o origin, msg *handler.Message, cause error) outbound {
	r := w.r
	now := time.Now()
	dec := w.rt.rules.Decide(cause) // the route's Retry.Rules: this error's ladder and dead-letter topic
	dlq := dec.Retry.DLQ(o.topic, r.cfg.Group)
	dest, tier, delay := dlq, 0, time.Duration(0)
	if w.rt.retriable(cause) {
		dest, tier, delay = dec.Retry.Next(o.topic, r.cfg.Group, o.tier)
	}
	f := wire.NewFailure(cause, src, o.prior, now)
	if mutate.On(mutate.OriginTS) {
		f.OriginalTimestamp = now
	}
	f.Attempt = msg.Attempt
	f.IdempotencyKey = msg.IdempotencyKey
	f.Tier = tier
	if tier > 0 {
		if ra, ok := handler.RetryAfterOf(cause); ok && ra > delay {
			w.log.Debug("idem: RetryAfter capped at the tier's delay", "offset", src.Offset, "retry_after", ra, "delay", delay, "to", dest)
		}
		f.DueAt = now.Add(delay)
	}
	return outbound{
		rec:  forward.Record{Topic: dest, Partition: src.Partition, Key: key, Value: value, Headers: wire.Encode(headers, f)},
		tier: tier,
		kind: string(f.Kind),
		f:    f,
		dlq:  dlq,
	}
}

// The forms a forward tries, in order (forwardOnce); toDLQ keeps what the
// dead-letter forms say.
const (
	formOut  = iota // out as it is: its tier, or the dead-letter topic
	dlqWhole        // key, value and headers
	dlqStub         // key and headers; the value is left out
	dlqBare         // key and idem's headers only: the last resort
)

// toDLQ returns o redirected to its dead-letter topic because its
// destination refused it for good with cause, keeping what level says.
func (o outbound) toDLQ(cause error, level int) outbound {
	f := o.f
	f.Tier, f.DueAt = 0, time.Time{}
	f.ForwardError = cause.Error()
	rec := o.rec
	rec.Topic = o.dlq
	if level >= dlqStub {
		f.Stub, f.OmittedBytes = true, len(o.rec.Value)
		rec.Value = nil
	}
	if level == dlqBare {
		own := wire.StripHeaders(o.rec.Headers)
		f.OmittedHeaders = len(own)
		rec.Headers = wire.Encode([]sarama.RecordHeader(nil), f)
	} else {
		rec.Headers = wire.Encode(o.rec.Headers, f)
	}
	return outbound{rec: rec, tier: 0, kind: o.kind, f: f, dlq: o.dlq, stub: level >= dlqStub}
}

// forward is the one way a record leaves for a retry tier or the dead-letter
// topic, and returns where the record goes: sent.tier is out.tier, or 0 when
// it is dead-lettered instead (sent.stub: as a stub). Every caller (a failed
// message, a drained one, a pending head recovered) decides what follows from
// sent, never from out.
//
// Without Transactions it forwards out at once, waits for the ack
// (acks=all) and runs Config.OnDeadLettered for a dead-lettered record
// (sendNow). With Transactions it stages out (stage): the forwards of the
// message in hand are sent, with its offset, when it settles (settle.go).
//
// Failures are classified by forward.IsPermanentForwardError:
//   - an outage (unknown topic, no leader, network): the partition waits and
//     retries the same forward with backoff, logging each try;
//   - a permanent refusal (too large, not authorised, invalid record): the
//     record goes to the dead-letter topic whole, or, if that refuses it for
//     good too, as a stub (key and headers, nil value, idem-payload-omitted),
//     or, if its own headers alone are too large, as a bare stub (key and
//     idem's headers only, idem-headers-omitted), logged at ERROR and counted
//     in idem_stubs_forwarded_total;
//   - the dead-letter topic refusing even the bare stub (it refuses every
//     record: an ACL, a policy): an outage-like wait, logged at ERROR once a
//     minute; the record is never dropped.
//
// Each retry starts again from out's own destination. With Transactions a
// broker's refusal aborts the transaction (the record cannot fall back within
// it): the refusal is remembered (refusals.go) and the record's next try, in
// the next session, starts at the form after the refused one. The only error
// is errStopping (nothing marked): the partition is stopping.
func (w *worker) forward(out outbound, msg *handler.Message) (sent outbound, err error) {
	out.rec.Headers = w.ob.injectTrace(out.rec.Headers, msg)
	if w.r.txn != nil {
		return txnHold{w}.stage(out, msg)
	}
	return ackedSend{w}.sendNow(out, msg)
}

// ackedSend is a worker's stage of forwards without Transactions: each sent
// and acked at once, falling back through the dead-letter forms when its
// destination refuses it. forward, on the worker, hands over to it (or to
// txnHold with Transactions). It holds nothing but the worker, so
// ackedSend{w} costs nothing to make.
type ackedSend struct{ *worker }

// sendNow is forward without Transactions: out is sent, acked, and its
// dead-letter hook run before it returns.
func (w ackedSend) sendNow(out outbound, msg *handler.Message) (sent outbound, err error) {
	r := w.r
	var loudAt time.Time
	for n := 1; ; n++ {
		loud := n == 1 || time.Since(loudAt) >= time.Minute
		sent, _, err := w.forwardOnce(out, msg, loud, formOut, nil)
		if err == nil {
			w.ob.forwarded(sent, msg)
			if sent.tier == 0 { // Config.OnDeadLettered, once per message (hooks.go)
				if err := hookCalls(w).deadLettered(sent, msg); err != nil {
					return outbound{}, err
				}
			}
			return sent, nil
		}
		w.stall.failed(err) // cleared when the caller marks the message
		switch {
		case !forward.IsPermanentForwardError(err):
			w.log.Error("idem: forward failed; offset not marked, retrying", "offset", msg.Offset, "to", sent.rec.Topic, "err", err, "try", n)
		case loud:
			loudAt = time.Now()
			w.log.Error("idem: the dead-letter topic refuses even a stub of this record; offset not marked, waiting",
				"offset", msg.Offset, "key", msg.IdempotencyKey, "to", sent.rec.Topic, "err", err, "try", n)
		}
		if !sleep(w.stopCtx, r.wait.outage(n)) {
			return outbound{}, errStopping
		}
	}
}

// forwardOnce tries out once in the forms from from on: out itself, and,
// when its destination refuses it for good, the dead-letter topic with the
// whole record (if out was for a tier), then a stub, then a bare stub
// without the record's own headers. cause is the refusal of the form before
// from (nil for formOut). It returns what it sent last, its form and that
// send's error.
func (w ackedSend) forwardOnce(out outbound, msg *handler.Message, loud bool, from int, cause error) (outbound, int, error) {
	r := w.r
	try := func(o outbound) (bool, error) {
		err := r.send(w.hctx, o.rec)
		if err == nil {
			return true, nil
		}
		r.m.ForwardErrors.WithLabelValues(r.cfg.Group, o.rec.Topic).Inc()
		if sendStops(err) {
			return false, err
		}
		if loud {
			w.log.Error("idem: destination refuses the record for good; dead-lettering it",
				"offset", msg.Offset, "key", msg.IdempotencyKey, "to", o.rec.Topic, "stub", o.stub, "bytes", len(o.rec.Value), "err", err)
		}
		return false, err
	}
	sent, err := out, cause
	for form := from; form <= dlqBare; form++ {
		o := out
		switch {
		case form == dlqWhole && out.tier == 0: // out is for the dead-letter topic already
			continue
		case form > formOut:
			o = out.toDLQ(err, form)
		}
		done, terr := try(o)
		sent, err = o, terr
		if done || sendStops(terr) {
			return o, form, terr
		}
	}
	return sent, dlqBare, err
}

// forwarded ends the attempt span of a forward and counts and logs it
// (forwardedLog); the forward is durable.
func (o *observer) forwarded(out outbound, msg *handler.Message) {
	o.forwardedSpan(out)
	o.forwardedLog(out, msg)
}

// forwardedSpan ends the attempt span of a message whose forward is decided.
func (o *observer) forwardedSpan(out outbound) {
	span := traceOutcomeRetried
	if out.tier == 0 {
		span = traceOutcomeDeadLettered
	}
	o.spanEnd(span, nil)
}

// forwardedLog counts and logs a durable forward: a retry tier at INFO, the
// dead-letter topic at WARN, a stub at ERROR.
func (o *observer) forwardedLog(out outbound, msg *handler.Message) {
	r := o.r
	dest := out.rec.Topic
	r.m.Forwarded.WithLabelValues(r.cfg.Group, dest, out.kind).Inc()
	outcome := coremetrics.OutcomeRetried
	if out.tier == 0 {
		outcome = coremetrics.OutcomeDeadLettered
	}
	r.m.Messages.WithLabelValues(r.cfg.Group, msg.Topic, o.route, outcome).Inc()
	if out.stub {
		r.m.StubsForwarded.WithLabelValues(r.cfg.Group, dest).Inc()
		o.log.Error("idem: message dead-lettered as a stub without its value", "offset", msg.Offset, "key", msg.IdempotencyKey,
			"to", dest, "omitted_bytes", out.f.OmittedBytes, "omitted_headers", out.f.OmittedHeaders, "reason", out.f.ForwardError)
		return
	}
	if out.tier == 0 { // an operator has work: WARN
		o.log.Warn("idem: message dead-lettered", "offset", msg.Offset, "key", msg.IdempotencyKey, "to", dest, "kind", out.kind,
			"attempt", msg.Attempt, "err", out.f.Error)
		return
	}
	o.log.Info("idem: message forwarded to a retry tier", "offset", msg.Offset, "key", msg.IdempotencyKey, "to", dest, "kind", out.kind, "attempt", msg.Attempt)
}

// setupRetryTopics creates the missing tier and dead-letter topics of every
// source topic, with at least the source's partitions and room for its
// largest records (forward.EnsureTopicsFor), logs a WARN for each existing
// one that is smaller than its source or keeps records shorter than twice its
// delay, and returns the Producer.MaxMessageBytes the forward producer needs.
func (s setup) retryTopics(ctx context.Context, client sarama.Client) (int, error) {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, fmt.Errorf("consumer: admin: %w", err)
	}
	// Closing the admin would close the shared client; it holds no other resource.
	limit := 0
	// The sources with the most partitions first: a dead-letter topic of a
	// rule, shared by every source, is then created with the most.
	sources := slices.Clone(s.cfg.Topics)
	parts := map[string]int{}
	for _, t := range sources {
		ps, _ := client.Partitions(t)
		parts[t] = len(ps)
	}
	slices.SortStableFunc(sources, func(a, b string) int { return parts[b] - parts[a] })
	for _, t := range sources {
		var sz forward.Sizes
		err := s.retry(ctx, client, "creating the retry topics of "+t, func() (err error) {
			sz = forward.Sizes{}
			var ps []retrytopic.Policy // every route's: the fallback's first, then each rule's
			for _, p := range s.cfg.retryPolicies(t) {
				for _, q := range p.Retries(t, s.cfg.Group) {
					if !slices.ContainsFunc(ps, func(o retrytopic.Policy) bool { return sameTopics(o, q, t, s.cfg.Group) }) {
						ps = append(ps, q)
					}
				}
			}
			if s.cfg.Defer != nil {
				ps = append(ps, s.deferredPolicy()) // the deferred topic, created like a tier
			}
			for _, p := range ps {
				psz, err := forward.EnsureTopicsFor(ctx, admin, t, s.cfg.Group, p)
				if err != nil {
					return err
				}
				sz.Warnings = append(sz.Warnings, psz.Warnings...)
				sz.MaxMessageBytes = max(sz.MaxMessageBytes, psz.MaxMessageBytes)
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("consumer: retry topics of %s: %w", t, err)
		}
		for _, w := range sz.Warnings {
			s.log.Warn("idem: "+strings.TrimPrefix(w.Error(), "retrytopic: "), "topic", w.Topic, "config", w.Config, "found", w.Found, "want", w.Want)
		}
		limit = max(limit, sz.ProducerMaxMessageBytes())
	}
	if err := s.retry(ctx, client, "reading metadata", func() error { return client.RefreshMetadata() }); err != nil {
		return 0, fmt.Errorf("consumer: metadata: %w", err)
	}
	return limit, nil
}

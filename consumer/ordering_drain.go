package consumer

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/wire"
)

// drain runs the messages parked behind head (now processed or
// dead-lettered) in their order. A parked message that fails retriably becomes
// the key's new head and goes to the first retry tier; the rest stay parked
// behind it. When that tier refuses it for good and it is dead-lettered
// instead (forward), it will not come back: the drain goes on behind it. It
// returns errStopping when the partition is stopping: the head is then not
// marked, and its redelivery drains again. Once the partition is stopping it starts
// no further parked message, even within the shutdown grace.
//
// at is the claim's offset of the message head whose settling runs the drain
// (-1: none, the claim's recovery), headAt where head's record was first
// produced (Offset -1: not known). With Transactions every forward of the
// drain is staged and commits with at's offset when head's message settles
// (settle.go), and the steps that hang on a forward (a parked message
// dead-lettered, a promotion) are marked with it (txnMark) rather than
// applied: Resolve applies them once at's offset is committed. So is a
// parked message dropped as expired whose OnExpired the transaction owes:
// its removal must not outlive a transaction that aborts, or the hook would
// be lost with it.
func (w byKey) drain(topic string, key []byte, head string, headAt keyorder.Origin, at int64) error {
	r := w.r
	hooks := w.hooks()
	mark := w.txnMark(at, head, headAt)
	for {
		var next keyorder.Record
		var more bool
		refused, err := w.orderTry("next", func(ctx context.Context) (err error) {
			next, more, err = r.order.Next(ctx, topic, key, head)
			return err
		})
		if err != nil {
			return err
		}
		if refused != nil {
			w.stuck(topic, key, head)
			return nil
		}
		if !more {
			return nil
		}
		if hooks.draining != nil {
			hooks.draining(w.stopCtx, w.hctx, next)
		}
		if w.stopCtx.Err() != nil {
			return errStopping // revoked or shutting down: start nothing new
		}
		msg, headers := parkedMessage(next)
		owedBefore := len(w.owed)                         // an OnExpired owed (Transactions) when it is dropped
		o := parkedRecords{r}.parkedOrigin(next, headers) // a tier's copy goes on from its tier
		msg.Attempt = o.attempts + 1
		rec := dedupe.Record{Group: r.cfg.Group, Key: next.IdempotencyKey, Topic: next.Topic, Partition: next.Partition, Offset: next.Offset,
			Epoch: r.ctl.epoch(msg, next.Topic, next.Partition, next.Offset)} // a re-drive's (control.go)
		deferral := deferralOfParked(next.Topic, next.Seq)
		var skip bool
		var failed error
		if next.Unreadable == nil {
			if skip, failed, err = routing(w).findRoute(msg); err != nil { // its own route (routing.go), or none
				return err
			}
		} else {
			w.useRoute(r.routes.none) // sealed at rest, its key destroyed: no type to route by
		}
		if failed == nil && !skip {
			d, err := verdicts(w).decide(rec, msg, deferral) // its turn came: decided before (a parked redelivery of an applied message), still live?
			if err != nil {
				return err
			}
			switch {
			case d.earlier:
				w.mx.duplicate.Inc()
			case next.Unreadable != nil: // sealed at rest, its key destroyed: a stub to the DLQ (sealed.go)
				failed = unreadable(next.Unreadable)
			case d.res.Status != expiry.Live:
				var drop bool
				if failed, drop, err = verdicts(w).expire(msg, next.Topic, d.res); err != nil {
					return err
				}
				if drop {
					failed = nil
				}
			default:
				if failed, err = w.process(rec, msg, nil); err != nil {
					return err
				}
				if failed, err = w.deferred(msg, failed, deferral); err != nil { // handler.DeferUntil: stored, then done
					return err
				}
			}
		}
		// done removes next from the parked messages (marks it with m when
		// its outcome is a forward: Transactions); stuck: the store refused,
		// and the key stays blocked (logged).
		done := func(m *keyorder.Mark) (stuck bool, err error) {
			refused, err := w.orderTry("done", func(ctx context.Context) error { return r.order.DoneAt(ctx, next.Seq, m) })
			if err == nil && refused != nil {
				w.stuck(topic, key, head)
				return true, nil
			}
			return false, err
		}
		if failed == nil {
			var m *keyorder.Mark
			if len(w.owed) > owedBefore { // dropped as expired, its OnExpired owed: its row goes with the transaction that owes the hook (Resolve), or comes back
				if at < 0 && !txnHold(w).commitNow() { // the claim's recovery: no mark, so committed before its row goes
					return errStopping
				}
				m = mark
			}
			if stuck, err := done(m); stuck || err != nil {
				return err
			}
			continue
		}
		src := wire.Source{Topic: next.Topic, Partition: next.Partition, Offset: next.Offset, Timestamp: next.Timestamp, Group: r.cfg.Group}
		out := w.failure(src, next.Key, next.Value, headers, o, msg, failed)
		if next.Unreadable != nil {
			out = out.asStub()
		}
		if out.tier == 0 {
			if _, err := w.forward(out, msg); err != nil {
				return err
			}
			if at < 0 && !txnHold(w).commitNow() { // the claim's recovery: no mark, so committed before its row goes
				return errStopping
			}
			if stuck, err := done(mark); stuck || err != nil {
				return err
			}
			continue
		}
		// The parked message becomes the head: promote it (recording the
		// forward as pending) in one transaction, then forward it.
		pending := next
		pending.Tier, pending.Dest, pending.DLQ = out.tier, out.rec.Topic, out.dlq
		pending.Headers = pending.Headers[:0:0]
		for _, h := range out.rec.Headers {
			pending.Headers = append(pending.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
		}
		refused, err = w.orderTry("promote", func(ctx context.Context) error { return r.order.PromoteAt(ctx, head, pending, mark) })
		switch {
		case err != nil:
			return err
		case orderErrorOf(refused) == orderConflict:
			// Another worker drained this key at the same time and promoted
			// first: it forwards the new head; this head is done.
			return nil
		case refused != nil:
			w.stuck(topic, key, head)
			return nil
		}
		if hooks.promoted != nil {
			hooks.promoted(w.stopCtx, w.hctx, pending)
		}
		head = next.IdempotencyKey
		again, err := w.forwardHead(out, msg, next.Topic, next.Key, head, at)
		if !again || err != nil {
			return err
		}
	}
}

// forwardHead forwards out, the record of the key's head ikey whose forward
// is recorded as pending, and clears the pending mark once the head went to
// its tier. again reports that the head was dead-lettered instead (its tier
// refused it for good): it will not come back from a tier, so the caller
// drains the messages parked behind it now, and the pending mark stays until
// that drain's last Next removes the head row: a drain cut short leaves the
// head pending, and the next claim forwards it again and drains behind it
// (otherwise nothing would: the key would stay blocked). errStopping: the
// partition is stopping; the forward stays pending and the next owner of
// the partition does it (orderingClaim.claim). at is as for drain; with
// Transactions and at -1 (the claim's recovery) the forward is sent and
// committed here, before its pending mark is cleared.
func (w byKey) forwardHead(out outbound, msg *handler.Message, topic string, key []byte, ikey string, at int64) (again bool, err error) {
	sent, err := w.forward(out, msg)
	if err != nil {
		return false, err
	}
	if at < 0 && !txnHold(w).commitNow() {
		return false, errStopping
	}
	if sent.tier == 0 {
		return true, nil
	}
	_, err = w.orderTry("forwarded", func(ctx context.Context) error {
		return w.r.order.Forwarded(ctx, topic, key, ikey)
	})
	return false, err
}

// parkedMessage rebuilds the handler message and headers of a parked record.
// A parked record keeps its origin: where, and when, the message was first
// produced (park stores the origin's coordinates and timestamp, also for a
// tier's or a deferred topic's copy).
func parkedMessage(rec keyorder.Record) (*handler.Message, []*sarama.RecordHeader) {
	msg := &handler.Message{
		Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp,
		IdempotencyKey: rec.IdempotencyKey, Attempt: 1,
		Original: handler.Origin{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp},
	}
	hs := make([]*sarama.RecordHeader, 0, len(rec.Headers))
	for _, h := range rec.Headers {
		msg.Headers = append(msg.Headers, handler.Header{Key: h.Key, Value: h.Value})
		hs = append(hs, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return msg, hs
}

// parkedRecords is a runner's stage of the ordering store's records as
// Kafka records: a parked record's origin, a pending head's forward (or its
// stub when its payload cannot be opened), and which topics they belong
// to. It holds nothing but the runner, so parkedRecords{r} costs nothing to
// make.
type parkedRecords struct{ *runner }

// parkedOrigin is the origin of the parked record rec (headers: its
// headers, as parkedMessage gives them): its own coordinates, and, for a
// copy parked when it was read from one of this group's retry tiers (its
// idem-* headers name this group, a tier and rec's own origin), that tier
// and the attempts made so far, so that its drain goes on up the ladder
// from there. A tier's copy is parked when another message of its key
// became the head while it was away (Transactions: the transaction
// carrying its outcome aborted, and it was read again); taken for a fresh
// message, it climbed the ladder again from tier 1, a second copy per hop
// (issue 28, phase 2: TestCrossingParkedTierCopyKeepsItsHop).
func (r parkedRecords) parkedOrigin(rec keyorder.Record, headers []*sarama.RecordHeader) origin {
	o := origin{topic: rec.Topic, partition: rec.Partition, offset: rec.Offset}
	f, ok, err := wire.Decode(headers)
	if !ok || err != nil || f.Group != r.cfg.Group || f.Tier < 1 ||
		f.OriginalTopic != rec.Topic || f.OriginalPartition != rec.Partition || f.OriginalOffset != rec.Offset {
		return o
	}
	o.tier, o.prior, o.attempts = f.Tier, f, f.Attempt
	return o
}

// pendingOutbound is the forward a promoted head still owes: the record
// Promote stored, to its tier, with the dead-letter topic of its error's
// rule for when the tier refuses it for good (both as the promotion
// decided them; the fallback's for a record of an earlier version).
func (r parkedRecords) pendingOutbound(rec keyorder.Record) outbound {
	hs := make([]sarama.RecordHeader, 0, len(rec.Headers))
	for _, h := range rec.Headers {
		hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	tier := max(rec.Tier, 1)
	f, _, _ := wire.Decode(hs)
	f.Tier = tier
	if f.IdempotencyKey == "" {
		f.IdempotencyKey = rec.IdempotencyKey
	}
	dest, dlq := rec.Dest, rec.DLQ
	if dest == "" {
		dest = r.policy.Tier(rec.Topic, r.cfg.Group, tier)
	}
	if dlq == "" {
		dlq = r.policy.DLQ(rec.Topic, r.cfg.Group)
	}
	return outbound{
		rec: forward.Record{
			Topic: dest, Partition: rec.Partition,
			Key: rec.Key, Value: rec.Value, Headers: hs,
		},
		tier: tier,
		kind: string(f.Kind),
		f:    f,
		dlq:  dlq,
	}
}

// tierGone reports (and logs) a pending head whose tier Retry.Tiers.Delays no
// longer has: it is not forwarded (its topic may be gone, and nothing would
// read it); warnUnread names it and `idem ordering release` sends it on.
func (r parkedRecords) tierGone(rec keyorder.Record) bool {
	if rec.Dest != "" {
		if _, _, ok := r.routes.tierOf(rec.Topic, r.cfg.Group, rec.Dest); ok {
			return false
		}
	} else if rec.Tier <= len(r.policy.Delays) {
		return false
	}
	r.log.Warn("idem: not forwarding a pending head: its retry tier is no longer configured", "key", rec.IdempotencyKey,
		"tier", rec.Tier, "tiers", len(r.policy.Delays),
		"release", fmt.Sprintf("idem ordering release --group %s --topic %s --key-hex %x --to source", r.cfg.Group, rec.Topic, rec.Key))
	return true
}

// sourceOf returns the source topic a subscribed topic belongs to: itself, or
// the source whose retry tier it is.
func (r parkedRecords) sourceOf(topic string) (string, bool) {
	for _, t := range r.cfg.Topics {
		if _, _, tier := r.routes.tierOf(t, r.cfg.Group, topic); t == topic || tier {
			return t, true
		}
	}
	return "", false
}

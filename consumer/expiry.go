package consumer

import (
	"context"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/internal/mutate"
)

// Expiry says when a message is too old to handle (issue 21, "Expiry"): a
// maximum age per topic, measured from the time the message was first
// produced (handler.Message.Origin's Timestamp: a retry tier does not make a
// message younger), and a deadline per message in the header
// "idem-deadline" (unix milliseconds, or RFC 3339 with a zone).
//
// The consumer checks it before each handler call (the first, and each
// in-process retry after a wait), before parking a message in
// ordering mode (Ordering ByKey), when a parked message's turn comes, and
// when a retry tier's record comes due. A message past either limit is not
// handled: it is dead-lettered with idem-error-kind "expired" and the reason
// in idem-error (or dropped and counted in idem_expired_total with Drop). A
// deadline header that is not a time dead-letters the message with kind
// "invalid-header", whatever Drop says. Expiry never overrides an outcome
// an earlier delivery made durable: a message whose idempotency key the
// inbox holds (applied before its deadline, its offset not yet committed
// when it was read again) is a duplicate, and one this very record deferred
// already stays deferred; neither is dead-lettered nor passed to OnExpired.
// An expired message is never parked; but a copy of a message the ordering
// store holds already (a redelivery) is skipped as parked, whether it
// expired or not: the stored message is checked when its turn comes, and
// dead-lettered then, once. See docs/deferral-and-expiry.md.
//
// The zero Expiry expires nothing by age and honours the deadline header.
type Expiry struct {
	// MaxAge is the oldest a record of a topic not in MaxAgeByTopic may be,
	// by its first timestamp, and still be handled. Negative values are
	// refused at start.
	// Default: 0 (no limit by age).
	MaxAge time.Duration
	// MaxAgeByTopic overrides MaxAge for the source topics it names; 0 there
	// means no limit for that topic.
	// Default: nil.
	MaxAgeByTopic map[string]time.Duration
	// Header is the name of the per-message deadline header.
	// Default: "idem-deadline".
	Header string
	// Drop drops an expired message (counted, never handled, nothing sent)
	// instead of dead-lettering it with kind "expired".
	// Default: false.
	Drop bool
	// OnExpired runs for a message that expired, dropped or dead-lettered,
	// once per message, in the inbox's transaction (dedupe.Tx(ctx)), and
	// never for a message the inbox shows applied. Without Transactions it
	// runs before the message is dead-lettered or dropped; with them, as
	// Config.OnDeadLettered does, once the Kafka transaction carrying the
	// outcome (the dead-letter record, or the offset of a dropped message)
	// has committed, so never for an outcome a read_committed reader does
	// not see; Transactions then need a database for the hooks a
	// transaction owes (see Config.OnDeadLettered).
	// Default: nil.
	OnExpired func(ctx context.Context, x Expired) error
}

// policy is e as the expiry package's Policy (its limits).
func (e Expiry) policy() expiry.Policy {
	return expiry.Policy{MaxAge: e.MaxAge, MaxAgeByTopic: e.MaxAgeByTopic, Header: e.Header, Drop: e.Drop}
}

// expiryOf is msg's verdict under rt's Expiry now, by its origin (a tier
// record is as old as its first delivery).
func (rt *route) expiryOf(msg *handler.Message) expiry.Result {
	p := rt.expiry.policy()
	o := msg.Origin()
	maxAge, header := p.MaxAgeOf(o.Topic), p.HeaderName()
	if maxAge <= 0 && !expiry.HasHeader(msg.Headers, header) {
		// Live whatever the time: the clock is not read (time.Now per
		// message was 6 % of the no-op path's CPU).
		return expiry.Result{Status: expiry.Live}
	}
	return expiry.Check(o.Timestamp, msg.Headers, header, maxAge, time.Now())
}

// expiredAtCall reports whether msg, a message that can expire (limited: a
// deadline or a maximum age applies to it), has expired by now: the check
// right before its handler call, inside the dedupe store's unit of work,
// for a limit that passed in a wait after decide's check. The swarm's
// mutation switch mutate.Expiry turns it off.
func (rt *route) expiredAtCall(limited bool, msg *handler.Message) bool {
	return limited && !mutate.On(mutate.Expiry) && rt.expiryOf(msg).Status != expiry.Live
}

// expire takes msg, which res (Config.Expiry's verdict, see decide) found
// expired or carrying a deadline that is not a time, to its outcome: it
// returns the error to dead-letter it with (a *handler.ExpiredError), or
// drop = true when it is to be dropped. Both are counted here, and
// Config.Expiry.OnExpired has run for an expired one (with Transactions it
// is owed, and runs once the transaction carrying the outcome commits:
// settle.go); topic is the topic msg is read from, for the counters. stop
// is errStopping when the partition is stopping (the hook was retrying).
func (w verdicts) expire(msg *handler.Message, topic string, res expiry.Result) (err error, drop bool, stop error) {
	if res.Status == expiry.Expired && w.rt.expiry.OnExpired != nil {
		x := Expired{Message: msg, Reason: res.Reason, Dropped: w.rt.expiry.Drop}
		if w.r.txn != nil {
			w.owed = append(w.owed, owedHook{key: hookKey("expired", msg.Origin()), x: &x, route: w.rt.name})
		} else if stop := hookCalls(w).expiredHook(x); stop != nil {
			return nil, false, stop
		}
	}
	err, drop = w.expiredVerdict(msg, topic, res)
	return err, drop, nil
}

// expiredVerdict is expire's outcome for res, counted.
func (w verdicts) expiredVerdict(msg *handler.Message, topic string, res expiry.Result) (err error, drop bool) {
	switch res.Status {
	case expiry.Live:
		return nil, false
	case expiry.Expired:
		if w.rt.expiry.Drop {
			w.r.m.Expired.WithLabelValues(w.r.cfg.Group, topic, w.rt.name, coremetrics.ExpiredDropped).Inc()
			w.r.m.Messages.WithLabelValues(w.r.cfg.Group, topic, w.rt.name, coremetrics.OutcomeExpired).Inc()
			w.ob.spanEnd(traceOutcomeExpired, nil)
			w.log.Info("idem: expired message dropped", "topic", topic, "offset", msg.Offset, "key", msg.IdempotencyKey, "reason", res.Reason)
			return nil, true
		}
		w.r.m.Expired.WithLabelValues(w.r.cfg.Group, topic, w.rt.name, coremetrics.ExpiredDeadLettered).Inc()
		return &handler.ExpiredError{Reason: res.Reason}, false
	default: // expiry.InvalidHeader: the producer's bug; never dropped
		return &handler.ExpiredError{Reason: res.Reason, InvalidHeader: true}, false
	}
}

package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/internal/mutate"
)

// A message's outcome is decided once (issue 28). Kafka delivers a record
// again whenever its offset was not committed (a crash, an aborted
// transaction, a revoke): the redelivery must end in the outcome the first
// delivery made durable, never in a second one. Two outcomes are durable
// before the offset is: applied (the inbox row, in the handler's
// transaction) and deferred (the deferred row, with a record of the
// deferral in the inbox, deferMsg). Forwards are durable with the offset
// (Transactions) or tolerated twice (the inbox turns a second tier copy into
// a duplicate).
//
// So the inbox is asked first, on every path a message takes to its
// outcome: a source record, a retry tier's record, a deferred copy, a
// batch's message (expired ones are handled alone) and a parked message
// whose turn came in a drain. For a live message the handler's own unit of
// work asks it (Dedupe.Process: a key already recorded is a duplicate and
// the handler is not called), and a deferral asks it again (deferMsg: a
// read already deferred is not deferred twice). Only an expired message
// would skip the handler, and with it the inbox: decide asks the inbox for
// it before it is called expired, so a message applied (or deferred) before
// its deadline, whose offset was not committed, is a duplicate when it is
// read again after the deadline, not dead-lettered as expired with its
// hooks run. (The consumer checked expiry first: the swarm's most frequent
// failure, "applied and dead-lettered (kind expired)".)
//
// What the hooks see follows: OnExpired runs only for a message decide
// found unapplied and undeferred, and, with Transactions, only once the
// transaction carrying its outcome (its dead-letter record, or the mark of
// a dropped one) has committed, as OnDeadLettered does (settle.go).

// verdicts is a worker's stage of deciding (see above): what a message
// takes before its handler (decide) and between its attempts
// (expiredSince), from an earlier delivery's outcome (earlier, seen) and
// Config.Expiry's (expire). It holds nothing but the worker, so
// verdicts{w} costs nothing to make.
type verdicts struct{ *worker }

// errUnseen is what decide's lookups give the store instead of a handler:
// the key has no recorded outcome, so nothing is recorded and nothing runs.
var errUnseen = errors.New("consumer: no earlier outcome")

// decision is what decide found for a message before its handler.
type decision struct {
	res     expiry.Result // the message's verdict under Config.Expiry now
	earlier bool          // an earlier delivery's outcome stands: applied, or deferred
}

// decide decides what a message takes before its handler (see above): live
// (the handler's unit of work decides the rest), an earlier delivery's
// outcome, or expired (res). rec is the message's inbox record and
// deferral the identity of this delivery's deferral (deferralOf), "" for
// none. errStopping: the partition is stopping.
func (w verdicts) decide(rec dedupe.Record, msg *handler.Message, deferral string) (decision, error) {
	d := decision{res: w.rt.expiryOf(msg)}
	if mutate.On(mutate.Expiry) {
		d.res = expiry.Result{Status: expiry.Live}
	}
	// callHandler checks again at the call, and expiredSince asks what
	// this asks, for the same delivery.
	w.limited, w.deferral = d.res.Limited, deferral
	if d.res.Status == expiry.Live || mutate.On(mutate.Decide) {
		return d, nil
	}
	var err error
	d.earlier, err = w.earlier(rec, msg)
	return d, err
}

// earlier reports whether an earlier delivery's outcome stands for the
// message in hand (rec, msg): the inbox holds rec's key (applied), or,
// with Config.Defer, the deferral of this delivery (w.deferral, set by
// decide: deferred before, its deferred copy has the outcome).
// errStopping: the partition is stopping.
func (w verdicts) earlier(rec dedupe.Record, msg *handler.Message) (bool, error) {
	recs := []dedupe.Record{rec}
	if w.r.cfg.Defer != nil && w.deferral != "" {
		recs = append(recs, deferralRecord(rec, w.deferral))
	}
	for _, r := range recs {
		if seen, err := w.seen(r, msg); err != nil || seen {
			return seen, err
		}
	}
	return false, nil
}

// seen asks the dedupe store whether rec's key has a recorded outcome,
// without recording one (the store runs errUnseen's function when it has
// none, and rolls back). Outages are waited out; a store that refuses the
// lookup for good (an error it would give every try) is logged and the
// message's own verdict follows. errStopping: the partition is stopping.
func (w verdicts) seen(rec dedupe.Record, msg *handler.Message) (bool, error) {
	r := w.r
	for n := 1; ; n++ {
		out, err := r.cfg.Dedupe.Process(w.hctx, rec, func(context.Context) error { return errUnseen })
		switch {
		case err == nil:
			return out == dedupe.Duplicate, nil
		case errors.Is(err, errUnseen):
			return false, nil
		case w.hctx.Err() != nil:
			return false, errStopping
		}
		if c, _ := r.classify(err); c != classOutage {
			w.log.Error("idem: the dedupe store refuses to say whether an expired message was handled before; dead-lettering it as expired",
				"offset", msg.Offset, "key", rec.Key, "err", err)
			return false, nil
		}
		w.stall.failed(err)
		r.m.StoreErrors.WithLabelValues(r.cfg.Group).Inc()
		w.log.Warn("idem: database unavailable; retrying the same message", "offset", msg.Offset, "err", err, "try", n)
		if !sleep(w.stopCtx, r.wait.outage(n)) {
			return false, errStopping
		}
	}
}

// deferralOf is the identity of a deferral by the delivery read at topic,
// partition and offset: a redelivery of that record has it too, a deferred
// copy (a record of its own) has another.
func deferralOf(topic string, partition int32, offset int64) string {
	return fmt.Sprintf("%s/%d/%d", topic, partition, offset)
}

// deferralOfParked is the identity of a deferral by a drain of the parked
// row seq of source: the drain of a reverted row (Transactions) runs again
// with the same row.
func deferralOfParked(source string, seq int64) string {
	return fmt.Sprintf("parked:%s/%d", source, seq)
}

// deferralRecord is the inbox record of the deferral id of rec's message:
// its own key, apart from the message's (the deferred copy is handled as
// the message, under the message's key).
func deferralRecord(rec dedupe.Record, id string) dedupe.Record {
	rec.Key = "idem:deferred:" + id
	return rec
}

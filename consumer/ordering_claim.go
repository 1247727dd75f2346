package consumer

import (
	"context"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
)

// orderingClaim is the stage that takes over a partition's share of the
// ordering store when the partition is claimed, before its first message:
// it settles the marks earlier owners left (resolve, Transactions only) and
// recovers the heads whose forward they left pending (recoverHead, under a
// lease). It runs once a claim; byKey holds the steps of the messages after
// it.
type orderingClaim struct{ *worker }

// pendingLease is how long a claim recovering a pending head keeps it from
// the other claims (keyorder.ClaimPending); a recovery that outlasts it (a
// long outage) may be done a second time.
const pendingLease = 30 * time.Second

// claim runs when the partition is claimed, before its first message:
// it finishes the ordering store's work a previous owner left for this
// partition, the one recovery path of a pending head. A drain that promoted a
// parked message and was revoked (or crashed) before forwarding it left the
// forward pending; the new owner of the partition — of the source topic or of
// one of its tiers, whichever is claimed first — forwards it now, so the key
// is not blocked for ever. The claims of a source partition and of its tier
// partitions may run at once (on one member, or on two): each leases the
// head first (keyorder.ClaimPending), and one waits while the other recovers
// it, so a head its tier refuses reaches the dead-letter topic once. A head
// its tier refuses for good is dead-lettered (forward) and the messages
// parked behind it are drained. The partition's reader runs already, so a
// revoke stops this at once. errStopping means the partition is stopping.
//
// With Transactions it first settles the marks of the partition's drains by
// its committed offset (resolve): committed ones are applied, the
// others reverted, so the redelivery of their head drains again. A pending
// head left by a run without Transactions (none is left unmarked with them)
// is forwarded and committed here, and the key's parked messages drained
// behind it when it was dead-lettered are committed with it (see txn.go for
// what a crash in that window does).
func (w orderingClaim) claim() error {
	r := w.r
	defer w.drop() // Transactions: what a stop left staged
	if err := w.resolve(); err != nil {
		return err
	}
	src, ok := parkedRecords{r}.sourceOf(w.tp.topic)
	if !ok {
		return nil
	}
	var pending []keyorder.Record
	refused, err := byKey(w).orderTry("claim", func(ctx context.Context) (err error) {
		pending, err = r.order.PendingOf(ctx, src, w.tp.partition)
		return err
	})
	if err != nil {
		return err
	}
	if refused != nil {
		return nil // logged; the next claim tries again
	}
	for _, rec := range pending {
		if (parkedRecords{r}).tierGone(rec) {
			continue
		}
		mine, err := w.leasePending(rec)
		if err != nil {
			return err
		}
		if !mine { // recovered by another claim meanwhile
			continue
		}
		if err := w.recoverHead(rec, src); err != nil {
			w.releasePending(rec)
			return err
		}
	}
	return nil
}

// recoverHead forwards the pending head rec, leased by w, and drains behind
// it when its tier refused it (see claim).
func (w orderingClaim) recoverHead(rec keyorder.Record, src string) error {
	msg := &handler.Message{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, IdempotencyKey: rec.IdempotencyKey}
	out := parkedRecords{w.r}.pendingOutbound(rec)
	if rec.Unreadable != nil { // sealed at rest, its key destroyed: a stub to the DLQ (sealed.go)
		out = parkedRecords{w.r}.unreadableRecord(rec)
	}
	again, err := byKey(w).forwardHead(out, msg, rec.Topic, rec.Key, rec.IdempotencyKey, -1)
	if err != nil {
		return err
	}
	w.log.Info("idem: forwarded a head whose forward a previous owner left pending", "key", rec.IdempotencyKey, "source", src)
	if !again {
		return nil
	}
	if err := byKey(w).drain(rec.Topic, rec.Key, rec.IdempotencyKey, keyorder.Origin{Partition: rec.Partition, Offset: rec.Offset}, -1); err != nil {
		return err
	}
	if !txnHold(w).commitNow() {
		return errStopping
	}
	return nil
}

// leasePending leases rec's pending forward to w (keyorder.ClaimPending),
// waiting while another claim holds it: false when it is no longer pending
// (that claim recovered it). errStopping: the partition is stopping.
func (w orderingClaim) leasePending(rec keyorder.Record) (bool, error) {
	for n := 1; ; n++ {
		var ok, held bool
		refused, err := byKey(w).orderTry("lease", func(ctx context.Context) (err error) {
			ok, held, err = w.r.order.ClaimPending(ctx, rec.Topic, rec.Key, rec.IdempotencyKey, pendingLease)
			return err
		})
		switch {
		case err != nil:
			return false, err
		case refused != nil: // logged; recover it unleased, as before leases
			return true, nil
		case ok || !held:
			return ok, nil
		}
		if !sleep(w.stopCtx, w.r.wait.outage(n)) {
			return false, errStopping
		}
	}
}

// releasePending gives back the lease of a recovery that stopped, so the
// next claim takes the head at once (best effort: the lease lapses anyway).
func (w orderingClaim) releasePending(rec keyorder.Record) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(w.hctx), 5*time.Second)
	defer cancel()
	if err := w.r.order.ReleasePending(ctx, rec.Topic, rec.Key, rec.IdempotencyKey); err != nil {
		w.log.Debug("idem: ordering: release a pending head's lease", "key", rec.IdempotencyKey, "err", err)
	}
}

// resolve settles the ordering marks of the claimed partition by the
// offset the claim starts from, its committed offset (Transactions only; see
// above). errStopping: the partition is stopping.
func (w orderingClaim) resolve() error {
	r := w.r
	if r.txn == nil {
		return nil
	}
	c := []keyorder.Committed{{Topic: w.tp.topic, Partition: w.tp.partition, Offset: max(w.kc.InitialOffset(), 0)}}
	_, err := byKey(w).orderTry("resolve", func(ctx context.Context) error { return r.order.Resolve(ctx, c, true) })
	return err
}

package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/mutate"
	"github.com/idemhq/idem/internal/txn"
)

// Settling a message with Transactions (issue 28). The forwards a message X
// owes (its own to a tier or the dead-letter topic, and, with Ordering ByKey,
// those of the parked messages its drain dead-letters or promotes) must
// commit in the Kafka transaction that commits X's offset, or not at all: a
// forward committed without X's offset is sent again when X is read again.
// So a worker decides the forwards while it takes X to its outcome, sends
// nothing meanwhile (stage), and settles X at the end (settle): it holds the
// transaction (txn.Owner.Hold) only to send the staged forwards and mark X's
// offset, never across a handler call, a hook or a wait, so a commit never
// waits for one, and no transaction stays open for the length of a drain.
//
// Whatever ends the settling before X's mark ends it with nothing of X
// committed: a stop before the hold sends nothing (the staged forwards are
// dropped, and the drain's steps marked with X's offset are reverted when
// X's partition is claimed again); a send that fails for good, or fails
// after an earlier one of X's went out, fails the transaction
// (txn.Owner.Fail), which aborts. A send that fails before any of X's went
// out, because the broker is unreachable, is tried again after a backoff,
// holding nothing meanwhile.
//
// OnDeadLettered runs only once X's forwards have committed, so it never
// runs for a record a read_committed reader does not see, and OnExpired
// only once the outcome of an expired X (its dead-letter record, or the mark
// of a dropped X) has: the hooks X owes
// are recorded (keyorder.OwedHook, marked with X's offset) before the hold,
// the transaction is committed after the mark, and then the hooks run, each
// removing its row. A member that stops or dies in between leaves the rows to
// the next claim of X's partition, which runs those its committed offset
// covers and drops the others (their transaction aborted: X is read again).
// Without Transactions a forward is sent and acked at once, and its hook run
// before X's mark (sendNow).

// staged is a forward decided for the message in hand (Transactions).
type staged struct {
	out  outbound         // as decided: its destination's form
	form int              // out's form (formOut, dlqWhole, ...)
	orig outbound         // the forward before planning: its own destination
	msg  *handler.Message // the message it forwards
}

// owedHook is a hook call the settling of the message in hand owes: the
// OnDeadLettered call of a staged dead-letter forward (d), or the OnExpired
// call of an expired message (x), dead-lettered or dropped.
type owedHook struct {
	key   string // hookKey
	d     DeadLettered
	x     *Expired
	route string // x's route, whose Expiry.OnExpired runs (route.go)
}

// txnHold is a worker's stage of the transaction hold (Transactions): what
// the message in hand stages, the hold that sends it and marks the offset,
// and the hooks that settling owes, and commitNow for a drain's recovery.
// A worker keeps only settle, which hands over to it, and drop. It holds
// nothing but the worker, so txnHold{w} costs nothing to make.
type txnHold struct{ *worker }

// stage is forward with Transactions: it decides out's form and stages it
// for the settling of the message in hand. The form is the one after a
// refusal of an earlier try (refusals.go), and the first one the producer
// accepts by size, so what is sent is known now: a broker that refuses it
// after all fails the transaction, and the next session's try starts at the
// form after it. errStopping: the partition is stopping.
func (w txnHold) stage(out outbound, msg *handler.Message) (outbound, error) {
	from, cause, err := w.resume(msg, out)
	if err != nil {
		return outbound{}, err
	}
	sent, form := out, from
	for ; form <= dlqBare; form++ {
		if form == dlqWhole && out.tier == 0 { // out is for the dead-letter topic already
			continue
		}
		sent = out
		if form > formOut {
			sent = out.toDLQ(cause, form)
		}
		if cause = w.r.txn.Fits(sent.rec); cause == nil {
			break
		}
	}
	form = min(form, dlqBare) // even the bare stub is too large: its send fails for good
	w.staged = append(w.staged, staged{out: sent, form: form, orig: out, msg: msg})
	w.ob.forwardedSpan(sent)
	if sent.tier == 0 && w.r.cfg.OnDeadLettered != nil {
		if mutate.On(mutate.OwedHooks) {
			return sent, hookCalls(w).deadLettered(sent, msg)
		}
		w.owed = append(w.owed, owedHook{key: hookKey("dead-lettered", msg.Origin()), d: deadLetteredOf(sent, msg)})
	}
	return sent, nil
}

// drop forgets what the message in hand staged: it is left for redelivery.
func (w *worker) drop() {
	clear(w.staged)
	w.staged = w.staged[:0]
	clear(w.owed)
	w.owed = w.owed[:0]
}

// settle records cm's outcome as final. Without Transactions its offset is
// marked. With them, the forwards staged for it are sent and its offset
// marked in one hold of the transaction, the transaction is committed when
// hooks are owed, and the hooks run (see the top of this file). errStopping:
// the partition is stopping, or the transaction failed; cm is not marked
// (or, when only its hooks are left, they are the next claim's).
func (w *worker) settle(cm *sarama.ConsumerMessage) error {
	if w.r.txn == nil {
		w.mark(cm)
		return nil
	}
	if err := (txnHold{w}).flush(cm.Offset, func() { w.mark(cm) }); err != nil {
		return err
	}
	return txnHold{w}.runOwed(false)
}

// commitNow sends what is staged, tied to no message of the claim (a pending
// head recovered at claim), and commits the open transaction at once
// (Transactions), then runs the hooks it owes. false: the transaction
// failed or the partition is stopping.
func (w txnHold) commitNow() bool {
	if w.r.txn == nil {
		return true
	}
	if w.flush(-1, nil) != nil {
		return false
	}
	return w.runOwed(true) == nil
}

// flush sends the staged forwards in the open transaction and then calls
// mark (if any), in one hold; at is the offset of the claim's message they
// settle (-1: none). With lanes it first waits, holding nothing, until
// every earlier message of the partition is final, so the mark covers the
// forwards at once (and the commit that follows covers the hooks owed). The
// owed hooks are recorded before the hold, marked with at. errStopping: the
// partition is stopping or the transaction failed; nothing staged is left.
func (w txnHold) flush(at int64, mark func()) error {
	if len(w.staged) == 0 && len(w.owed) == 0 {
		if mark != nil {
			mark()
		}
		return nil
	}
	defer w.dropStaged()
	if at >= 0 && !w.awaitEarlier(at) {
		w.drop()
		return errStopping
	}
	if err := w.oweHooks(at); err != nil {
		w.drop()
		return err
	}
	for n := 1; ; n++ {
		release, err := w.r.txn.Hold()
		if err != nil { // the transaction failed: the session restarts
			w.drop()
			return errStopping
		}
		i, err := w.sendStaged()
		if err == nil {
			if mark != nil && !(mutate.On(mutate.TxnMark) && len(w.staged) > 0) {
				mark()
			}
			for _, s := range w.staged { // in the transaction the hold is in (refusals.go)
				w.r.refused.wentOut(s.msg)
			}
			release()
			for _, s := range w.staged {
				w.ob.forwardedLog(s.out, s.msg)
			}
			return nil
		}
		s := w.staged[i]
		w.r.m.ForwardErrors.WithLabelValues(w.r.cfg.Group, s.out.rec.Topic).Inc()
		w.stall.failed(err)
		if i > 0 || errors.Is(err, txn.ErrBroken) || forward.IsPermanentForwardError(err) {
			// Part of what must commit with the mark may be in the
			// transaction: it must not commit.
			if !errors.Is(err, txn.ErrBroken) {
				err = w.r.txn.Fail(fmt.Errorf("forward of offset %d to %s: %w", s.msg.Offset, s.out.rec.Topic, err))
			}
			release()
			w.refusedInTxn(s, err)
			w.drop()
			return errStopping
		}
		release()
		w.log.Error("idem: forward failed; offset not marked, retrying", "offset", s.msg.Offset, "to", s.out.rec.Topic, "err", err, "try", n)
		if !sleep(w.stopCtx, w.r.wait.outage(n)) {
			w.drop()
			return errStopping
		}
	}
}

// sendStaged sends the staged forwards in order; on an error it returns the
// index of the forward that failed.
func (w txnHold) sendStaged() (int, error) {
	for i, s := range w.staged {
		if err := w.r.send(w.hctx, s.out.rec); err != nil {
			return i, err
		}
	}
	return 0, nil
}

// dropStaged forgets the staged forwards (sent, or dropped).
func (w txnHold) dropStaged() {
	clear(w.staged)
	w.staged = w.staged[:0]
}

// oweHooks records the hooks the staged forwards owe, marked with at, the
// offset their commit carries (keyorder.OweHooks), trying through outages.
// At -1 (tied to no message: commitNow) nothing is recorded: commitNow runs
// them after its commit, and a crash in between loses them. A store that
// refuses the rows for good is logged; the hooks then run after the commit
// all the same, without the crash guard. errStopping: the partition is
// stopping.
func (w txnHold) oweHooks(at int64) error {
	if len(w.owed) == 0 || at < 0 {
		return nil
	}
	hooks := make([]keyorder.OwedHook, 0, len(w.owed))
	for _, h := range w.owed {
		b, err := json.Marshal(encodeOwed(h))
		if err != nil {
			w.log.Error("idem: cannot record an owed hook; it runs after the commit without a crash guard", "key", h.key, "err", err)
			continue
		}
		hooks = append(hooks, keyorder.OwedHook{Key: h.key, Mark: keyorder.Mark{Topic: w.tp.topic, Partition: w.tp.partition, Offset: at, Owner: w.owner}, Payload: b})
	}
	_, err := byKey(w).orderTry("owe hooks", func(ctx context.Context) error { return w.r.owed.OweHooks(ctx, hooks) })
	return err
}

// runOwed runs the hooks the settled message owes once its transaction has
// committed: when hooks are owed (or always, with commit) it commits the
// open transaction now, then runs each hook (runHook: once per message,
// retried while it fails) and removes its row. errStopping: the commit
// failed (the next claim drops the rows) or the partition is stopping (the
// next claim runs them).
func (w txnHold) runOwed(commit bool) error {
	if len(w.owed) == 0 {
		if commit {
			if err := (memberTxn{w.r}).commit(w.sess); err != nil {
				return errStopping
			}
		}
		return nil
	}
	defer w.drop()
	if err := (memberTxn{w.r}).commit(w.sess); err != nil {
		return errStopping
	}
	for _, h := range w.owed {
		if err := w.runOwedHook(h); err != nil {
			return err
		}
	}
	return nil
}

// runOwedHook runs the hook call h owes, once (its inbox key is h.key), and
// removes its row.
func (w txnHold) runOwedHook(h owedHook) error {
	var err error
	if x := h.x; x != nil {
		on := w.r.routes.expiryOf(h.route).OnExpired
		if on == nil { // a route renamed or removed since the row was written: nothing to call
			w.log.Warn("idem: an owed OnExpired call names a route without one; dropping it", "route", h.route, "key", h.key)
			_, err = byKey(w).orderTry("hook ran", func(ctx context.Context) error { return w.r.owed.HookRan(ctx, h.key) })
			return err
		}
		err = hookCalls(w).runHookKey("expired", h.key, x.Message, func(ctx context.Context) error { return on(ctx, *x) })
	} else {
		d := h.d
		err = hookCalls(w).runHookKey("dead-lettered", h.key, d.Message, func(ctx context.Context) error { return w.r.cfg.OnDeadLettered(ctx, d) })
	}
	if err != nil {
		return err
	}
	_, err = byKey(w).orderTry("hook ran", func(ctx context.Context) error { return w.r.owed.HookRan(ctx, h.key) })
	return err
}

// claimHooks runs, when a partition is claimed (Transactions with
// OnDeadLettered), the hooks whose forwards a previous owner committed and
// did not run, and drops those whose transaction did not commit, by the
// offset the claim starts from (see the top of this file). errStopping: the
// partition is stopping.
func (w txnHold) claimHooks() error {
	if w.r.owed == nil {
		return nil
	}
	c := keyorder.Committed{Topic: w.tp.topic, Partition: w.tp.partition, Offset: max(w.kc.InitialOffset(), 0)}
	var owed []keyorder.OwedHook
	refused, err := byKey(w).orderTry("claim hooks", func(ctx context.Context) (err error) {
		owed, err = w.r.owed.ClaimHooks(ctx, c)
		return err
	})
	if err != nil || refused != nil {
		return err // refused: logged; the next claim tries again
	}
	for _, h := range owed {
		var j owedJSON
		if err := json.Unmarshal(h.Payload, &j); err != nil {
			w.log.Error("idem: an owed hook cannot be decoded; dropping it", "key", h.Key, "err", err)
			continue
		}
		if err := w.runOwedHook(j.decode(h.Key)); err != nil {
			return err
		}
		w.log.Info("idem: ran a hook a previous owner's committed transaction owed", "key", h.Key)
	}
	return nil
}

// owedJSON is an owed hook's call as its row keeps it: a DeadLettered, or
// with Hook "expired" an Expired (Reason, Dropped; DLQ, Kind and Error
// empty).
type owedJSON struct {
	Hook           string            `json:"hook,omitempty"`
	Topic          string            `json:"topic"`
	Partition      int32             `json:"partition"`
	Offset         int64             `json:"offset"`
	Key            []byte            `json:"key"`
	Value          []byte            `json:"value"`
	Headers        []keyorder.Header `json:"headers"`
	Timestamp      time.Time         `json:"ts"`
	IdempotencyKey string            `json:"ikey"`
	Attempt        int               `json:"attempt"`
	Original       handler.Origin    `json:"origin"`
	DLQ            string            `json:"dlq,omitempty"`
	Kind           handler.Kind      `json:"kind,omitempty"`
	Error          string            `json:"error,omitempty"`
	Reason         string            `json:"reason,omitempty"`
	Dropped        bool              `json:"dropped,omitempty"`
	Route          string            `json:"route,omitempty"`
}

func encodeOwed(h owedHook) owedJSON {
	m := h.d.Message
	if h.x != nil {
		m = h.x.Message
	}
	j := owedJSON{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value,
		Timestamp: m.Timestamp, IdempotencyKey: m.IdempotencyKey, Attempt: m.Attempt, Original: m.Original}
	for _, h := range m.Headers {
		j.Headers = append(j.Headers, keyorder.Header{Key: h.Key, Value: h.Value})
	}
	if h.x != nil {
		j.Hook, j.Reason, j.Dropped, j.Route = "expired", h.x.Reason, h.x.Dropped, h.route
	} else {
		j.DLQ, j.Kind, j.Error = h.d.Topic, h.d.Kind, h.d.Error
	}
	return j
}

// decode is the owed hook of key j records.
func (j owedJSON) decode(key string) owedHook {
	m := &handler.Message{Topic: j.Topic, Partition: j.Partition, Offset: j.Offset, Key: j.Key, Value: j.Value,
		Timestamp: j.Timestamp, IdempotencyKey: j.IdempotencyKey, Attempt: j.Attempt, Original: j.Original}
	for _, h := range j.Headers {
		m.Headers = append(m.Headers, handler.Header{Key: h.Key, Value: h.Value})
	}
	if j.Hook == "expired" {
		return owedHook{key: key, x: &Expired{Message: m, Reason: j.Reason, Dropped: j.Dropped}, route: j.Route}
	}
	return owedHook{key: key, d: DeadLettered{Message: m, Topic: j.DLQ, Kind: j.Kind, Error: j.Error}}
}

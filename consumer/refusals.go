package consumer

import (
	"errors"
	"sync"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/mutate"
	"github.com/idemhq/idem/internal/txn"
)

// With Transactions, a record that a destination refuses for good (too large
// for the dead-letter topic, invalid in a compacted tier, not authorised)
// cannot fall back to its next form in the same transaction, as forwardOnce
// does without Transactions: the refused produce leaves the transactional
// producer abortable, the transaction is aborted and the session ends
// (txn.RefusedError). The next session reads the record again; without a
// memory of the refusal it would be refused again, for ever. So the runner
// remembers where each refused record's forward left off, and its next try
// starts at the next form: a record ends, after at most one aborted
// transaction per form, in the dead-letter topic (whole, as a stub or as a
// bare stub), exactly once for read_committed readers. When every form was
// refused (the dead-letter topic refuses every record: an ACL, a policy) the
// record waits like an outage between rounds, as without Transactions, and
// is never dropped.
//
// The memory lives for the Run and is keyed by the consumed record's
// coordinates. A partition that moves to another member meanwhile costs that
// member one more aborted transaction per form at most. A record's refusal
// is forgotten only once the transaction that carries its forward commits
// (txn.Owner.Ended), not when the forward is sent: that transaction may
// still abort, for another record's refusal, and the record is then read
// again and must start at its form again. (Forgotten at the send, n refused
// records of one partition cost 2^n - 1 aborted transactions, each abort
// forgetting the refusals before it; with refused records on the member's
// other partitions, sharing its transactions, a partition never moved:
// TestCrossingRefusalsOfOnePartitionAbortOnceEach.)

// maxRefusals bounds the remembered refusals; past it an old one is
// forgotten (its record then costs one more aborted transaction).
const maxRefusals = 1024

// refusals is the runner's memory of refused forwards (Transactions only).
type refusals struct {
	mu sync.Mutex
	m  map[refusalKey]*refusal
	// sent are the refused records whose forward went out in the open
	// transaction: forgotten when it commits, kept when it aborts.
	sent map[refusalKey]struct{}
}

// refusalKey is the consumed record's coordinates.
type refusalKey struct {
	topic     string
	partition int32
	offset    int64
}

// refusal is where a record's forward left off.
type refusal struct {
	dest   string    // the forward's own destination (outbound.rec.Topic)
	next   int       // the form to try next; past dlqBare: every form was refused
	cause  error     // the last refusal (the next form's idem-forward-error)
	rounds int       // rounds in which every form was refused
	loudAt time.Time // when such a round was last logged at ERROR
}

func newRefusals() *refusals {
	return &refusals{m: map[refusalKey]*refusal{}, sent: map[refusalKey]struct{}{}}
}

func keyOfRefusal(msg *handler.Message) refusalKey {
	return refusalKey{msg.Topic, msg.Partition, msg.Offset}
}

// refused records that msg's forward to dest was refused with cause and
// goes on at form next.
func (rs *refusals) refused(msg *handler.Message, dest string, next int, cause error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	k := keyOfRefusal(msg)
	ref := rs.m[k]
	if ref == nil {
		if len(rs.m) >= maxRefusals {
			for old := range rs.m {
				delete(rs.m, old)
				break
			}
		}
		ref = &refusal{}
		rs.m[k] = ref
	}
	ref.dest, ref.next, ref.cause = dest, next, cause
}

// wentOut records that msg's forward went out in the open transaction: its
// refusal, if any, is forgotten once that transaction commits (ended).
func (rs *refusals) wentOut(msg *handler.Message) {
	k := keyOfRefusal(msg)
	rs.mu.Lock()
	if _, ok := rs.m[k]; ok {
		rs.sent[k] = struct{}{}
	}
	rs.mu.Unlock()
}

// ended is the owner's Ended: the open transaction ended, committed or
// not. The refusals of the records it carried are forgotten when it
// committed, and kept otherwise (the records are read again).
func (rs *refusals) ended(committed bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if committed {
		for k := range rs.sent {
			delete(rs.m, k)
		}
	}
	clear(rs.sent)
}

// resume returns the form msg's forward of out starts at and the refusal of
// the form before it: formOut and nil when no earlier try of a forward to
// out's destination was refused (a handler whose error changed may send the
// record elsewhere now). When every form was refused in an earlier round,
// it waits like an outage (the ERROR log at most once a minute) and starts
// the next round from formOut. The only error is errStopping.
func (w txnHold) resume(msg *handler.Message, out outbound) (from int, cause error, err error) {
	rs := w.r.refused
	rs.mu.Lock()
	ref := rs.m[keyOfRefusal(msg)]
	if ref == nil || ref.dest != out.rec.Topic || mutate.On(mutate.Refusals) {
		rs.mu.Unlock()
		return formOut, nil, nil
	}
	if ref.next <= dlqBare {
		defer rs.mu.Unlock()
		return ref.next, ref.cause, nil
	}
	ref.rounds++
	ref.next = formOut
	n, last := ref.rounds, ref.cause
	loud := ref.loudAt.IsZero() || time.Since(ref.loudAt) >= time.Minute
	if loud {
		ref.loudAt = time.Now()
	}
	rs.mu.Unlock()
	if loud {
		w.log.Error("idem: the dead-letter topic refuses even a stub of this record; offset not marked, waiting",
			"offset", msg.Offset, "key", msg.IdempotencyKey, "err", last, "round", n)
	}
	if !sleep(w.stopCtx, w.r.wait.outage(n)) {
		return 0, nil, errStopping
	}
	return formOut, nil, nil
}

// refusedInTxn logs and remembers a staged forward s whose transaction
// failed (err wraps txn.ErrBroken) when it failed because the destination
// refused this very record at its form: the record's next try starts at the
// next form. (The owner sends one record at a time, so a refusal it reports
// is this record's.)
func (w txnHold) refusedInTxn(s staged, err error) {
	var ref *txn.RefusedError
	if w.r.refused == nil || !errors.As(err, &ref) {
		return
	}
	out, msg, form := s.orig, s.msg, s.form
	next := form + 1
	if next == dlqWhole && out.tier == 0 { // out was for the dead-letter topic already
		next = dlqStub
	}
	w.r.refused.refused(msg, out.rec.Topic, next, ref.Err)
	then := "the dead-letter topic, whole"
	switch next {
	case dlqStub:
		then = "a stub without its value"
	case dlqBare:
		then = "a bare stub without its own headers"
	case dlqBare + 1:
		then = "its first destination again, after a wait: every form was refused"
	}
	w.log.Error("idem: destination refuses the record for good; its Kafka transaction is aborted and the partition is read again from the committed offsets",
		"offset", msg.Offset, "key", msg.IdempotencyKey, "to", ref.Topic, "err", ref.Err, "next_try", then)
}

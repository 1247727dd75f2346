package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/txn"
	"github.com/idemhq/idem/retrytopic"
)

// This file is the transactional mode (Config.Transactions): the runner's
// transaction owner (internal/txn), the member's one offset writer and the
// one producer of its forwards.

// validateTransactions checks what Config.Transactions needs.
func (c Config) validateTransactions(bad func(field string, v any, rule string)) {
	if c.Transactions.Timeout < 0 {
		bad("Transactions.Timeout", c.Transactions.Timeout, "must be > 0")
	}
	if !c.Transactions.Enabled {
		return
	}
	if c.Transactions.Timeout <= c.CommitInterval {
		bad("Transactions.Timeout", c.Transactions.Timeout, fmt.Sprintf("must exceed CommitInterval (%s): a transaction stays open that long", c.CommitInterval))
	}
	// Ordering ByKey stays refused (issue 20): a drain removes a parked
	// message from PostgreSQL (Done) or clears its promoted head's pending
	// forward (Forwarded) once the forward is acked, which in a transaction
	// is before it commits; an aborted transaction would then lose the
	// message (the DLQ copy aborted, the row gone) or block its key for ever
	// (the tier copy aborted, the head's forward marked done). Lifting it
	// takes, on the rows, a mark of the transaction that sent them, Done,
	// Forwarded and Next's unblocking run only once it is committed, and
	// claimOrdering settling or reverting marked rows by the group's
	// committed offsets; with a SIGKILL test at each step.
	//
	// What a try with the refusal lifted showed (helper txnorder):
	//   - a drain's forwards all commit with the offset of the head message
	//     whose settling ran the drain (X on partition tp): the first forward
	//     takes the hold and the head's mark ends it. So (tp, X) can be the
	//     mark, with no offset metadata: committed iff tp's committed offset
	//     is > X. A settle after each commit (tokens of tp below the offset
	//     just committed) and the same settle at claim (below the claim's
	//     committed offset; above it: revert the rows to parked, the head
	//     row to X, so X's redelivery drains them again) is one code path.
	//   - claimOrdering's forward of a pending head is tied to no message:
	//     its hold is never released when no message follows on the
	//     partition, and Commit then waits for ever
	//     (TestOrderingRecoversPendingForward hangs in Owner.Commit, at
	//     gate.Lock). It needs a mark of its own: the claimed partition's
	//     committed offset recommitted with a monotonic token in its
	//     metadata, which every later commit of the partition carries on (a
	//     later commit overwrites the metadata).
	//   - with lanes, forward's awaitEarlier gets the parked message's
	//     source offset, not the head's: the drain waits on its own head
	//     for ever (TestOrderingParkedFailureBecomesHead/lanes
	//     stalls at 1 applied: "forward waits" on the tier, offset=1,
	//     first_unfinished=0, the head itself). Pass the head's offset.
	//   - Next's unblock while marked rows still wait for the commit races
	//     a new message of the key on another partition (the source vs the
	//     tier); a revert must then not block the key behind the old head.
	//   - TestOrderingByKey passed with Transactions as is (no abort, no
	//     crash); TestOrderingParkedFailureBecomesHead counts tier records by
	//     end offset, which counts commit markers too (4 for 2 records).
	if c.Ordering.keyed {
		bad("Ordering", c.Ordering, "must not be ByKey with Transactions: ByKey settles parked messages in PostgreSQL when their forward is sent, before the Kafka transaction commits")
	}
	if c.ReadUncommitted {
		bad("ReadUncommitted", c.ReadUncommitted, "must be false with Transactions: idem's own tiers are written in transactions")
	}
	if c.Sarama != nil && c.Sarama.Version != sarama.DefaultVersion && !c.Sarama.Version.IsAtLeast(sarama.V2_5_0_0) {
		bad("Sarama", c.Sarama.Version, "Version must be at least 2.5 with Transactions (TxnOffsetCommit with the generation, KIP-447)")
	}
}

var txnIDUnsafe = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// transactionalID is the member's transactional.id (Config.Transactions).
func (c Config) transactionalID() string {
	if c.InstanceID != "" {
		return "idem-" + c.Group + "-" + c.InstanceID
	}
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idem-" + c.Group + "-" + txnIDUnsafe.ReplaceAllString(host, "_") + "-" + hex.EncodeToString(b[:])
}

// txnProducerConfig is the config of the transaction owner's own client.
func txnProducerConfig(base *sarama.Config, cfg Config, maxBytes int) *sarama.Config {
	c := txn.Config(base, cfg.transactionalID(), cfg.Transactions.Timeout)
	c.Producer.MaxMessageBytes = max(c.Producer.MaxMessageBytes, maxBytes)
	return c
}

// startTxn makes the member's transaction owner, on a client of its own
// (one request in flight, the transactional id), retrying through outages
// like the rest of the start-up. The caller closes the returned client after
// the owner.
func (r *runner) startTxn(ctx context.Context, st setup, maxBytes int) (sarama.Client, error) {
	pcfg := txnProducerConfig(r.scfg, r.cfg, maxBytes)
	var client sarama.Client
	var owner *txn.Owner
	err := st.retry(ctx, nil, "starting the transactional producer", func() (err error) {
		if client == nil {
			if client, err = sarama.NewClient(r.cfg.Brokers, pcfg); err != nil {
				return err
			}
		}
		owner, err = txn.New(client, r.cfg.Group, r.cfg.InstanceID, r.log)
		return err
	})
	if err != nil {
		if client != nil {
			_ = client.Close()
		}
		return nil, fmt.Errorf("consumer: transactional producer %q: %w", pcfg.Producer.Transaction.ID, err)
	}
	if h := hooksOf(r.baseCtx); h != nil {
		owner.BeforeCommit = h.beforeCommit
	}
	r.txn, r.refused = owner, newRefusals()
	r.log.Info("idem: transactional mode", "transactional_id", pcfg.Producer.Transaction.ID, "commit_interval", r.cfg.CommitInterval)
	return client, nil
}

// commitTxn commits the open transaction with the offsets marked so far,
// fenced by s's generation. A failure is logged by the owner and ends the
// session (claims watch txn.Failed).
func (r *runner) commitTxn(s sarama.ConsumerGroupSession) {
	_ = r.txn.Commit(sarama.NewConsumerGroupMetadataFromSession(s, r.cfg.Group, nil))
}

// startCommits readies the owner for session s and commits its transaction
// every CommitInterval until s ends or stop is called (Cleanup). With
// Transactions these are the member's only offset commits.
func (r *runner) startCommits(s sarama.ConsumerGroupSession) (stop func(), err error) {
	if err := r.txn.Reset(); err != nil {
		return nil, fmt.Errorf("consumer: transactional producer: %w", err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.cfg.CommitInterval)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				r.commitTxn(s)
			case <-s.Context().Done():
				return
			case <-done:
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }, nil
}

// txnFailed is closed when the session's transaction failed (nil channel
// without Transactions: never).
func (r *runner) txnFailed() <-chan struct{} {
	if r.txn == nil {
		return nil
	}
	return r.txn.Failed()
}

// markOffset makes next the partition's offset to commit: through the
// transaction owner with Transactions, else sarama's offset manager.
func (c *claim) markOffset(next int64) {
	if c.r.txn != nil {
		c.r.txn.Mark(c.tp.topic, c.tp.partition, next)
		return
	}
	c.sess.MarkOffset(c.tp.topic, c.tp.partition, next, "")
}

// awaitEarlier waits, with Transactions and messages that finish out of
// order (lanes, batches), until every message of the partition before offset
// is final, so that a forward of the message at offset, its send and the
// mark of its offset go into one transaction: the mark then covers the
// offset at once. (A forward committed in a transaction whose offsets stop
// below it, behind an earlier message still in another lane, would be
// forwarded again after a crash.) It holds nothing while it waits, so a slow
// earlier message never keeps a transaction open. false: the partition is
// stopping.
func (w *worker) awaitEarlier(offset int64) bool {
	if w.r.txn == nil || w.track == nil {
		return true
	}
	return w.track.waitFirst(w.stopCtx, offset, func(first int64) {
		if w.debug {
			w.log.Debug("idem: forward waits for the earlier messages of its partition (Transactions)", "offset", offset, "first_unfinished", first)
		}
	})
}

// hold joins the open transaction for a forward and the mark that follows
// it (Transactions only; endHold ends it). false: the transaction failed and
// the partition must stop.
func (w *worker) hold() bool {
	if w.r.txn == nil || w.release != nil {
		return true
	}
	rel, err := w.r.txn.Hold()
	if err != nil {
		return false
	}
	w.release = rel
	return true
}

// endHold ends w's hold, if any.
func (w *worker) endHold() {
	if w.release != nil {
		w.release()
		w.release = nil
	}
}

// send is one try of a forward: in the open transaction with Transactions,
// else acked on its own.
func (r *runner) send(ctx context.Context, rec forward.Record) error {
	if r.txn != nil {
		return r.txn.Forward(ctx, rec)
	}
	return r.fwd.Forward(ctx, rec)
}

// sendStops says a forward try's error ends the forward as it is: an outage
// (the caller waits and tries again) or a failed transaction (the partition
// stops), rather than a refusal that sends the record on to the dead-letter
// topic.
func sendStops(err error) bool {
	return !retrytopic.IsPermanentForwardError(err) || errors.Is(err, txn.ErrBroken)
}

package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/mutate"
	"github.com/idemhq/idem/internal/txn"
)

// TransactionsConfig is Config.Transactions. Enabled makes what the member
// writes to Kafka exactly once for read_committed readers (KIP-447): one
// transactional producer per member, whose transactions commit the forwards
// to retry tiers and the dead-letter topic together with the source offsets
// of the records they settle, and the offsets of records whose effect is in
// the dedupe store too: with transactions on, the member never sends a plain
// offset commit. Offsets go with the member's generation, so a member the
// group has expelled (paused past its session timeout, partitioned away)
// cannot commit: its transaction is aborted with everything it forwarded. A
// crash or a stop anywhere leaves either a message's forwards and its
// offset, or none of them: the forwards a message owes (its own, and with
// Ordering ByKey those of the parked messages its drain dead-letters or
// promotes) are sent together with its offset's mark when it settles, in
// one short hold of the transaction that spans no handler call and no hook,
// and a stop or a failed send before that mark sends none of them or fails
// the transaction. A transaction that fails ends the member's session; the
// next session reads its partitions again from the committed offsets
// (effects are kept once by the dedupe store). Config.OnDeadLettered runs
// once the dead-letter record's transaction has committed, and
// Expiry.OnExpired once the transaction carrying the expired message's
// outcome has.
//
// Its cost: a commit (EndTxn, two round trips to the transaction
// coordinator, a marker written to every partition the transaction touched)
// every CommitInterval; forwards wait while a commit is in flight; readers
// of the tiers and the dead-letter topic must use read_committed (idem's own
// consumers do) and see forwards only after the commit, so up to
// CommitInterval later. With lanes (Concurrency > 1, Limits.Adaptive) a forward
// first waits, holding nothing, until every earlier message of its partition
// is final, so that its offset commits in the forward's transaction: the
// lane of a failing message waits behind the slowest earlier message of its
// partition (forwards are rare; the other lanes go on). A record a
// destination refuses for good (too large for the dead-letter topic, invalid
// in a compacted tier) costs an aborted transaction, and a re-read of the
// member's partitions from the committed offsets, per form it falls back
// through (the dead-letter topic whole, a stub, a bare stub): the member
// remembers the refusal, so the record ends in the dead-letter topic once.
// Needs Kafka ≥ 2.5 (idem asks for protocol 4.1) and read_committed. With
// Ordering ByKey, a drain's forwards (the parked messages that follow a head:
// dead-lettered, or promoted to its tier) commit with the head's offset, and
// the drain's steps in the ordering store are applied once that offset is
// committed, or reverted when it is not, so the head's redelivery drains
// again: each parked message once per hop, in key order (the argument is in
// txn.go, with its limits: a head left pending by a run without
// Transactions, a member frozen mid-drain past its session timeout). The
// transactional.id is "idem-<Group>:<InstanceID>" with an InstanceID (a
// restarted member fences its predecessor and aborts its open transaction
// at once), else "idem-<Group>:<host>+<random>" (a crashed member's open
// transaction then holds read_committed readers of its partitions back
// until Timeout). The last ':' ends the group (an InstanceID holds none), so
// no two groups' members share an id. Versions before issue 28 used
// "idem-<Group>-<InstanceID>", which two groups could share (group
// "payments" with instance "eu-1", group "payments-eu" with instance "1"):
// see the changelog for how a running deployment moves (a new id does not
// fence an old one's open transaction). Set outbox.Relay.ExactlyOnce too for the
// relay's events. A transaction ends with a marker in each partition it
// wrote, after the last record: lag computed from end offsets
// (idem_consumer_lag of tiers, idem_dlq_depth) counts those markers.
type TransactionsConfig struct {
	// Enabled turns the transactional mode on.
	// Default: false.
	Enabled bool

	// Timeout is how long the transaction coordinator lets a transaction
	// stay open before it aborts it (a member that died with a transaction
	// open). It must exceed Config.CommitInterval.
	// Default: 10s. Kafka: transaction.timeout.ms.
	Timeout time.Duration
}

// This file is the transactional mode (Config.Transactions): the runner's
// transaction owner (internal/txn), the member's one offset writer and the
// one producer of its forwards.

// transactions checks what Config.Transactions needs.
func (c configCheck) transactions() {
	if c.Transactions.Timeout < 0 {
		c.errs.Bad("Transactions.Timeout", c.Transactions.Timeout, "must be > 0")
	}
	if !c.Transactions.Enabled {
		return
	}
	if c.Transactions.Timeout <= c.CommitInterval {
		c.errs.Bad("Transactions.Timeout", c.Transactions.Timeout, fmt.Sprintf("must exceed CommitInterval (%s): a transaction stays open that long", c.CommitInterval))
	}
	if c.ReadUncommitted {
		c.errs.Bad("ReadUncommitted", c.ReadUncommitted, "must be false with Transactions: idem's own tiers are written in transactions")
	}
	const needsDB = "with Transactions needs a database for the hooks a transaction owes until it commits: " +
		"a Dedupe store on PostgreSQL (dedupe.NewPostgres) or Ordering ByKey(pool)"
	if c.OnDeadLettered != nil && orderingDB(c.Config) == nil {
		c.errs.Bad("OnDeadLettered", "set", needsDB)
	}
	if c.Expiry.OnExpired != nil && orderingDB(c.Config) == nil {
		c.errs.Bad("Expiry.OnExpired", "set", needsDB)
	}
	for i, r := range c.Routes {
		if r.Expiry != nil && r.Expiry.OnExpired != nil && orderingDB(c.Config) == nil {
			c.errs.Bad(fmt.Sprintf("Routes[%d] (%s).Expiry.OnExpired", i, r.Name), "set", needsDB)
		}
	}
	if c.Sarama != nil && c.Sarama.Version != sarama.DefaultVersion && !c.Sarama.Version.IsAtLeast(sarama.V2_5_0_0) {
		c.errs.Bad("Sarama", c.Sarama.Version, "Version must be at least 2.5 with Transactions (TxnOffsetCommit with the generation, KIP-447)")
	}
}

var txnIDUnsafe = regexp.MustCompile(`[^a-zA-Z0-9._-]+`)

// transactionalID is the member's transactional.id (Config.Transactions):
// "idem-<Group>:<InstanceID>", or "idem-<Group>:<host>+<random>" without
// an InstanceID. It is unambiguous: an InstanceID (and the host, made safe)
// holds only [a-zA-Z0-9._-], so the last ':' ends the group, whatever the
// group holds, and a '+' marks an id without an InstanceID. (Issue 28: the
// "idem-<Group>-<InstanceID>" of earlier versions gave group "payments" with
// instance "eu-1" and group "payments-eu" with instance "1" one id, and
// their members fenced each other.)
func (c Config) transactionalID() string {
	if mutate.On(mutate.TxnID) && c.InstanceID != "" {
		return "idem-" + c.Group + "-" + c.InstanceID
	}
	if c.InstanceID != "" {
		return "idem-" + c.Group + ":" + c.InstanceID
	}
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idem-" + c.Group + ":" + txnIDUnsafe.ReplaceAllString(host, "_") + "+" + hex.EncodeToString(b[:])
}

// txnProducerConfig is the config of the transaction owner's own client.
func txnProducerConfig(base *sarama.Config, cfg Config, maxBytes int) *sarama.Config {
	c := txn.Config(base, cfg.transactionalID(), cfg.Transactions.Timeout)
	c.Producer.MaxMessageBytes = max(c.Producer.MaxMessageBytes, maxBytes)
	return c
}

// memberTxn is a runner's stage of the member's Kafka transaction
// (Transactions): its owner started on a client of its own, its commits
// every CommitInterval and at each settling that asks for one, and what a
// commit settles in the ordering store. It holds nothing but the runner,
// so memberTxn{r} costs nothing to make.
type memberTxn struct{ *runner }

// start makes the member's transaction owner, on a client of its own
// (one request in flight, the transactional id), retrying through outages
// like the rest of the start-up. The caller closes the returned client after
// the owner.
func (r memberTxn) start(ctx context.Context, st setup, maxBytes int) (sarama.Client, error) {
	pcfg := txnProducerConfig(r.scfg, r.cfg, maxBytes)
	if h := hooksOf(r.baseCtx); h != nil && h.dispatched != nil {
		pcfg.Producer.Interceptors = append(slices.Clone(pcfg.Producer.Interceptors), interceptor(h.dispatched))
	}
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
		if h.beforeSend != nil {
			owner.BeforeSend = func(rec forward.Record) { h.beforeSend(rec, owner.Failed) }
		}
		owner.AfterSend = h.afterSend
	}
	owner.AfterCommit = r.resolveCommitted
	r.txn, r.refused = owner, newRefusals()
	owner.Ended = r.refused.ended
	r.log.Info("idem: transactional mode", "transactional_id", pcfg.Producer.Transaction.ID, "commit_interval", r.cfg.CommitInterval)
	return client, nil
}

// commit commits the open transaction with the offsets marked so far,
// fenced by s's generation. A failure is logged by the owner and ends the
// session (claims watch txn.Failed); it wraps txn.ErrBroken.
func (r memberTxn) commit(s sarama.ConsumerGroupSession) error {
	return r.txn.Commit(sarama.NewConsumerGroupMetadataFromSession(s, r.cfg.Group, nil))
}

// startCommits readies the owner for session s and commits its transaction
// every CommitInterval until s ends or stop is called (Cleanup). With
// Transactions these are the member's only offset commits.
func (r memberTxn) startCommits(s sarama.ConsumerGroupSession) (stop func(), err error) {
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
				_ = r.commit(s)
			case <-s.Context().Done():
				return
			case <-done:
				return
			}
		}
	})
	return func() { close(done); wg.Wait() }, nil
}

// failed is closed when the session's transaction failed (nil channel
// without Transactions: never).
func (r memberTxn) failed() <-chan struct{} {
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
// is final, so that the forwards of the message at offset and the mark of
// its offset go into one transaction (settle): the mark then covers the
// offset at once. (A forward committed in a transaction whose offsets stop
// below it, behind an earlier message still in another lane, would be
// forwarded again after a crash.) It holds nothing while it waits, so a slow
// earlier message never keeps a transaction open. false: the partition is
// stopping.
func (w txnHold) awaitEarlier(offset int64) bool {
	if w.r.txn == nil || w.track == nil {
		return true
	}
	return w.track.waitFirst(w.stopCtx, offset, func(first int64) {
		if w.debug {
			w.log.Debug("idem: forward waits for the earlier messages of its partition (Transactions)", "offset", offset, "first_unfinished", first)
		}
	})
}

// send is one try of a forward: in the open transaction with Transactions,
// else acked on its own.
func (r *runner) send(ctx context.Context, rec forward.Record) error {
	if h := hooksOf(r.baseCtx); h != nil && h.sendFault != nil {
		if err := h.sendFault(rec); err != nil {
			return err
		}
	}
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
	return !forward.IsPermanentForwardError(err) || errors.Is(err, txn.ErrBroken)
}

// Ordering ByKey with Transactions. The ordering store (internal/keyorder)
// is in PostgreSQL and a drain's forwards are in a Kafka transaction, which
// commits up to CommitInterval after them, or aborts. A drain step that hangs
// on a forward is therefore not applied when the forward is acked, as it is
// without Transactions, but marked (keyorder.Mark), and applied or reverted
// once the transaction's outcome is known:
//
//   - The mark. A drain runs while the claim's message X (offset at on the
//     partition tp, the key's head, processed or dead-lettered) is settled,
//     before X's offset is marked. Every forward of the drain is staged and
//     sent when X settles, with X's mark, in one hold of the transaction
//     (settle.go; with lanes once X is the partition's first unfinished
//     message), so the forwards commit in exactly the transaction that
//     commits tp's offset past X, and no transaction stays open while the
//     drain runs handlers. So (tp, X) is the mark: the forwards are
//     committed iff the group's committed offset of tp is > X. Nothing more is written to
//     Kafka, and the committed offset is read back with RequireStable (the
//     claim's start), so an open transaction is never taken for an ended one.
//   - What is marked. A parked message dead-lettered by the drain (DoneAt:
//     the row stays, marked, and Next skips it) and a parked message promoted
//     to head (PromoteAt: the head row keeps the head it had before the
//     drain, revert_head; the parked row stays, marked; Forwarded leaves a
//     marked head's pending forward alone). A parked message the drain
//     processed, expired or deferred has its effect in PostgreSQL: its row
//     is removed at once, as without Transactions (a redelivery of it is a
//     duplicate).
//   - Redeliveries. A record that parked a message, or drained it, can be
//     read again when its offset was not committed (a crash, an abort, or a
//     claim of its partition running before the claim that reverts a drain
//     of another partition). So in this mode a parked row records the copy
//     that parked it (keyorder.Copy) until that copy's offset is committed,
//     a drained row stays (drained, not drainable) until then, and
//     keyorder.ParkCopy skips as parked any copy of a message the store
//     holds in any state, but for the head's own return from its tier: a
//     message is never handled from a redelivered copy once the ordering
//     store has it.
//   - Applied after each commit. The owner's AfterCommit runs
//     keyorder.Resolve with the offsets just committed: marks below them are
//     applied (marked rows drained, pending forwards cleared); drained rows
//     whose parking copy is committed are removed.
//   - Applied or reverted at claim. orderingClaim.claim runs keyorder.Resolve for
//     the claimed partition with the offset the claim starts from, before the
//     partition's first message: marks below it are applied (the commit
//     happened, and the member died or failed before its AfterCommit), marks
//     at or above it are reverted: the marked head gets its head before the
//     drain back, and marked parked rows are parked again behind X (the key
//     blocked by X again if Next unblocked it meanwhile, but not in place of
//     a head another message of the key became since: the rows then wait
//     behind that one). X is then read again from tp, settles again, and its
//     drain runs the reverted rows again, in their order. This is the one
//     recovery path: a failed transaction ends the session (Failed), and a
//     SIGKILL hands tp to a new claim, so every mark meets a claim of its
//     partition before its head is read again.
//
// SIGKILL at any point. Before the mark is written: nothing of the drain is
// in Kafka or marked; X is read again and drains again. Between the mark and
// the commit: the transaction aborts (on the coordinator's timeout or at the
// next member's fencing InitProducerId), tp's committed offset is ≤ X, and
// the claim reverts the marks: each parked message gets exactly one copy,
// from the drain that runs again. After the commit and before AfterCommit:
// the claim applies the marks. A zombie cannot commit (fenced by the group
// generation, or by its transactional id when another process took its
// InstanceID): the marks it wrote before its successor's claim are reverted
// there, and it can write none after: each claim records itself as its
// partition's owner first (claimOwner, keyorder.Claim), and a mark whose
// owner was replaced is refused (keyorder.ErrFenced), which stops the
// zombie's work on the partition. The promise is thus, for a
// read_committed reader: each parked message reaches its tier or the DLQ
// exactly once per hop, in key order, and no key stays blocked. Limits: a
// pending head left by a run without Transactions (none is left with them)
// is recovered by orderingClaim.claim as without them, its forward and the drain
// behind it then committed at once: a crash in that window can forward it
// twice, or lose the dead-letter copies of that drain; a reverted drain
// whose head X is not read again
// (its partition reset past it) leaves the key blocked for `idem ordering
// release`.

// txnMark is the mark of a drain's steps with Transactions (see above): the
// claim's partition, the offset at of the message head whose settling runs
// the drain, head, and the origin headAt of head's record (Offset -1: not
// known), which a revert restores the head at. nil without Transactions and
// for at < 0 (claim recovery), whose steps apply at once.
func (w byKey) txnMark(at int64, head string, headAt keyorder.Origin) *keyorder.Mark {
	if w.r.txn == nil || at < 0 {
		return nil
	}
	return &keyorder.Mark{Topic: w.tp.topic, Partition: w.tp.partition, Offset: at, Head: head, HeadAt: &headAt, Owner: w.owner}
}

// claimOwner records this claim as its partition's owner in the ordering
// store (keyorder.Claim; Transactions with Ordering or owed hooks), before
// the marks earlier owners left are settled (orderingClaim.resolve, claimHooks):
// from then on a member that lost the partition (a zombie, frozen past its
// session timeout, or one whose InstanceID another process took) can write
// no marked step, which this claim's next commit would otherwise take for
// its own. A store that refuses the claim for good (logged) leaves this
// claim's marks unfenced. errStopping: the partition is stopping.
func (w txnHold) claimOwner() error {
	r := w.r
	if r.txn == nil || (r.order == nil && r.owed == nil) {
		return nil
	}
	owner := rand.Text()
	stores := []*keyorder.Store{r.order, r.owed}
	if r.order != nil {
		// r.owed, when set, keeps its rows in the ordering store's database
		// for the same group (orderingDB): one claim row fences both.
		stores = stores[:1]
	}
	for _, s := range stores {
		if s == nil {
			continue
		}
		refused, err := byKey(w).orderTry("claim", func(ctx context.Context) error { return s.Claim(ctx, w.tp.topic, w.tp.partition, owner) })
		if err != nil {
			return err
		}
		if refused != nil {
			return nil // logged: this claim's marks stay unfenced
		}
	}
	w.owner = owner
	return nil
}

// resolveCommitted applies the ordering marks below the offsets a
// transaction just committed (the owner's AfterCommit). A failure is logged:
// Next skips marked rows meanwhile, and the next commit or claim of their
// partition applies them.
func (r memberTxn) resolveCommitted(committed map[string]map[int32]int64) {
	if r.order == nil {
		return
	}
	var cs []keyorder.Committed
	for topic, ps := range committed {
		for p, next := range ps {
			cs = append(cs, keyorder.Committed{Topic: topic, Partition: p, Offset: next})
		}
	}
	// Bounded well inside the transaction timeout: the commit loop waits
	// for it, and the next transaction may be open meanwhile.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.baseCtx), r.cfg.Transactions.Timeout/4)
	defer cancel()
	if err := r.order.Resolve(ctx, cs, false); err != nil {
		r.log.Warn("idem: ordering: could not settle the steps of a committed transaction; the next commit or claim does", "err", err)
	}
}

// Package txn is the transaction owner of a consumer-group member in idem's
// transactional mode (consumer.Config.Transactions): one transactional
// producer through which every record the member forwards and every offset it
// commits goes, one Kafka transaction at a time.
//
// The rules it keeps (sarama v1.61.1, Kafka ≥ 2.5, KIP-447):
//   - one Begin…Commit at a time: a record sent while a commit or an abort
//     ends would poison the commit, so a member settling a message holds
//     the owner shared (Hold) from its forwards' sends to the mark of the
//     offset they settle, and Commit takes it exclusively, waiting for them.
//     A hold spans sends and a mark only, never a handler or a hook, so a
//     commit waits for round trips to the broker, nothing longer;
//   - one send at a time: a refused send leaves the producer's transaction
//     in error, and sarama then fails every send queued behind it with the
//     same error (its lastError); Forward sends one record at a time (and
//     the producer puts one record in a request, see
//     retrytopic.ConfigureProducer), so a refusal it reports is its own
//     record's, never blamed on another;
//   - offsets go into the transaction with AddOffsetsToTxnWithGroupMetadata
//     and the member's current generation, member id and instance id, so a
//     member the group no longer knows (a zombie) cannot commit: its
//     TxnOffsetCommit fails with ILLEGAL_GENERATION or UNKNOWN_MEMBER_ID and
//     the transaction is aborted, with every record it held;
//   - after a failed transaction nothing more is taken (Hold fails, Mark is
//     dropped) until Reset: sarama cannot rewind a claim, so the member ends
//     its session (Failed) and the next one reads the committed offsets again;
//     a producer in a fatal state (fenced) is closed and made anew by Reset,
//     never by the Forward that met the fatal error (another forward may be
//     about to send on it, and sarama panics on a send to a closed producer);
//   - a transaction is aborted only by one holding the owner exclusively
//     (Commit, Reset, Close): a forward that fails leaves it open, in error,
//     because other forwards may still be sending on the same producer, and
//     sarama's abort races their sends; the next session's Reset aborts it.
package txn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/retrytopic"
)

// ErrBroken is wrapped by every error of an owner whose transaction failed:
// nothing can join it until Reset, which aborts it if a failed forward left
// it open.
var ErrBroken = errors.New("txn: transaction aborted; the session must restart from the committed offsets")

// RefusedError is the error of a Forward whose record the broker refused for
// good (forward.IsPermanentForwardError: too large for the destination,
// invalid there, not authorised): the refused produce left the transaction
// abortable, so it is aborted (by Reset or Close, once no forward is in
// flight). It wraps ErrBroken and the refusal; the
// caller can send the record on in another form in a later transaction.
// Only the Forward whose own record was refused returns it.
type RefusedError struct {
	Topic  string // the destination that refused the record
	Err    error  // the refusal
	broken error  // the owner's error, wrapping ErrBroken
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("txn: %s refused the record for good; transaction aborted: %v", e.Topic, e.Err)
}

// Unwrap returns ErrBroken's error and the refusal.
func (e *RefusedError) Unwrap() []error { return []error{e.broken, e.Err} }

// Owner owns one member's transactional producer. It is safe for concurrent
// use.
type Owner struct {
	client   sarama.Client // the producer's own client: Transaction.ID set, MaxOpenRequests 1
	group    string
	instance *string // group.instance.id, nil for dynamic membership
	log      *slog.Logger

	// BeforeCommit, when set, runs in Commit after the offsets were added
	// and before EndTxn, with the number of records the transaction holds.
	// Tests use it to crash or stall a member at that point; an error it
	// returns fails the transaction as a failed EndTxn would (a forced
	// abort).
	BeforeCommit func(records int) error

	// BeforeSend and AfterSend, when set, run in Forward just before the
	// record is handed to the producer and just after the producer answered
	// (err: its error). Tests use them to line up concurrent forwards.
	BeforeSend func(rec forward.Record)
	AfterSend  func(rec forward.Record, err error)

	// AfterCommit, when set, runs after each transaction that committed
	// offsets, with those offsets (the next offset to read, by topic and
	// partition), once forwards may join the next transaction again. It runs
	// in the goroutine that called Commit, before Commit returns.
	AfterCommit func(committed map[string]map[int32]int64)

	// Ended, when set, runs each time a transaction of the owner ends, while
	// no forward can join it or the next one (the caller holds the owner
	// exclusively): committed is true after a commit, false when the
	// transaction failed or is dropped (an abort at Commit, Reset or Close,
	// a producer closed after a fatal error). What the forwards of a
	// transaction decided holds only once it committed; the consumer keeps
	// its memory of refused records until then. It must not block.
	Ended func(committed bool)

	// gate: Hold shares it from a forward to its mark; Commit and Abort take
	// it exclusively, so no record is sent while a transaction ends.
	gate sync.RWMutex
	// sendMu makes Forward send one record at a time (see the package doc).
	sendMu sync.Mutex

	mu      sync.Mutex
	prod    sarama.SyncProducer // nil after a fatal error, until Reset
	fwd     *forward.Forwarder
	open    bool                       // BeginTxn done
	records int                        // records sent in the open transaction
	offsets map[string]map[int32]int64 // next offset to commit, by topic and partition
	broken  error                      // why the last transaction failed; nil when usable
	failed  chan struct{}              // closed when broken is set
}

// Config returns base adjusted for a transactional producer with the given
// transactional id: retrytopic.ConfigureProducer's settings (idempotent,
// acks=all, one request in flight, manual partitioner), Version at least
// V4_1_0_0 (TxnOffsetCommit v3 with the generation), and the transaction
// timeout. The caller makes a client of its own from it, so the consumer's
// client keeps its parallel requests.
func Config(base *sarama.Config, id string, timeout time.Duration) *sarama.Config {
	c := *base
	retrytopic.ConfigureProducer(&c)
	if !c.Version.IsAtLeast(sarama.V4_1_0_0) {
		c.Version = sarama.V4_1_0_0
	}
	c.Producer.Transaction.ID = id
	c.Producer.Transaction.Timeout = timeout
	return &c
}

// New makes the transactional producer on client (InitProducerId: an older
// producer of the same transactional id is fenced and its open transaction
// aborted by the coordinator). group is the consumer group whose offsets the
// transactions commit; instance its group.instance.id ("" for none).
func New(client sarama.Client, group, instance string, log *slog.Logger) (*Owner, error) {
	o := &Owner{client: client, group: group, log: log, offsets: map[string]map[int32]int64{}, failed: make(chan struct{})}
	if instance != "" {
		o.instance = &instance
	}
	if err := o.newProducer(); err != nil {
		return nil, err
	}
	return o, nil
}

func (o *Owner) newProducer() error {
	p, err := sarama.NewSyncProducerFromClient(o.client)
	if err != nil {
		return fmt.Errorf("txn: transactional producer %q: %w", o.client.Config().Producer.Transaction.ID, err)
	}
	o.prod, o.fwd = p, forward.NewForwarder(p, o.client)
	return nil
}

// Failed is closed when the current transaction fails; the member must then
// end its session and call Reset before its next one.
func (o *Owner) Failed() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failed
}

// Hold joins the open transaction for the forwards that settle one message
// and the mark of its offset; release ends the hold. Commit waits for every
// hold to end, so forwards and their offset always commit in the same
// transaction. Hold only around sends and a mark: a commit waits for the
// hold. It fails with ErrBroken when the transaction has failed. A goroutine
// must not Hold twice.
func (o *Owner) Hold() (release func(), err error) {
	o.gate.RLock()
	o.mu.Lock()
	err = o.broken
	o.mu.Unlock()
	if err != nil {
		o.gate.RUnlock()
		return nil, err
	}
	return o.gate.RUnlock, nil
}

// Forward sends rec in the open transaction (beginning one if none is open)
// and waits for its acknowledgement. The caller holds a Hold. A record the
// forwarder refuses before sending it (larger than Producer.MaxMessageBytes,
// an unknown topic) returns that error and leaves the transaction intact; a
// failed send fails the transaction: the error then wraps ErrBroken, and is a
// *RefusedError when the broker refused the record for good.
func (o *Owner) Forward(ctx context.Context, rec forward.Record) error {
	o.sendMu.Lock()
	defer o.sendMu.Unlock()
	o.mu.Lock()
	if o.broken != nil {
		defer o.mu.Unlock()
		return o.broken
	}
	if !o.open {
		if err := o.prod.BeginTxn(); err != nil {
			defer o.mu.Unlock()
			return o.failLocked(fmt.Errorf("txn: begin: %w", err), false)
		}
		o.open = true
	}
	o.records++
	prod, fwd := o.prod, o.fwd
	o.mu.Unlock()
	if o.BeforeSend != nil {
		o.BeforeSend(rec)
	}
	err := fwd.Forward(ctx, rec)
	if o.AfterSend != nil {
		o.AfterSend(rec, err)
	}
	if err == nil {
		return nil
	}
	if st := prod.TxnStatus(); st&(sarama.ProducerTxnFlagAbortableError|sarama.ProducerTxnFlagFatalError) == 0 {
		return err // refused before the send: the transaction is intact
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	broken := o.failLocked(fmt.Errorf("txn: send to %s: %w", rec.Topic, err), false)
	if forward.IsPermanentForwardError(err) {
		return &RefusedError{Topic: rec.Topic, Err: err, broken: broken}
	}
	return broken
}

// Fail fails the open transaction with err, as a failed send would: nothing
// joins it any more (Hold fails, marks are dropped), Failed is closed, and
// the next session's Reset aborts it. The caller holds a Hold and has sent
// part of what must commit together (the forwards of one message and its
// offset) but cannot send the rest: the transaction must not commit. It
// returns the owner's error, wrapping ErrBroken.
func (o *Owner) Fail(err error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failLocked(err, false)
}

// Fits returns the error Forward would return for rec before sending it
// (larger than the producer's Producer.MaxMessageBytes), or nil.
func (o *Owner) Fits(rec forward.Record) error {
	return forward.Fits(rec, o.client.Config().Producer.MaxMessageBytes)
}

// Mark records next as the offset to commit for topic/partition in the
// transaction (the offset of the last settled record plus one). A mark of a
// failed transaction is dropped: its records are read again.
func (o *Owner) Mark(topic string, partition int32, next int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.broken != nil {
		return
	}
	ps := o.offsets[topic]
	if ps == nil {
		ps = map[int32]int64{}
		o.offsets[topic] = ps
	}
	ps[partition] = next
}

// Commit commits the open transaction with the marked offsets, fenced by gm
// (sarama.NewConsumerGroupMetadataFromSession: the session's generation and
// member id). A transaction with offsets only is begun here. Nothing to
// commit returns nil. On failure the transaction is aborted (or the producer
// dropped when it is fatal), Failed is closed and the error wraps ErrBroken.
// AfterCommit, if set, runs before it returns.
func (o *Owner) Commit(gm *sarama.ConsumerGroupMetadata) error {
	committed, err := o.commitGated(gm)
	if err == nil && len(committed) > 0 && o.AfterCommit != nil {
		o.AfterCommit(committed)
	}
	return err
}

// commitGated is Commit without AfterCommit; it returns the offsets it
// committed.
func (o *Owner) commitGated(gm *sarama.ConsumerGroupMetadata) (map[string]map[int32]int64, error) {
	o.gate.Lock() // no forward runs until the transaction has ended
	defer o.gate.Unlock()
	o.mu.Lock()
	if o.broken != nil {
		defer o.mu.Unlock()
		return nil, o.broken
	}
	if !o.open && len(o.offsets) == 0 {
		o.mu.Unlock()
		return nil, nil
	}
	if !o.open {
		if err := o.prod.BeginTxn(); err != nil {
			defer o.mu.Unlock()
			return nil, o.failLocked(fmt.Errorf("txn: begin: %w", err), true)
		}
		o.open = true
	}
	// Marks of records settled meanwhile (effects in the dedupe store: no
	// forward can run) go on into the map for the next transaction; mu is
	// not held over the round trips.
	snap := make(map[string][]*sarama.PartitionOffsetMetadata, len(o.offsets))
	for topic, ps := range o.offsets {
		for p, next := range ps {
			snap[topic] = append(snap[topic], &sarama.PartitionOffsetMetadata{Partition: p, Offset: next, LeaderEpoch: -1})
		}
	}
	prod, records := o.prod, o.records
	o.mu.Unlock()
	err := o.commit(prod, snap, gm, records)
	defer o.ended(err == nil) // still gated: no forward joins the next transaction yet
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		return nil, o.failLocked(err, true)
	}
	o.open, o.records = false, 0
	committed := make(map[string]map[int32]int64, len(snap))
	for topic, ps := range snap {
		committed[topic] = make(map[int32]int64, len(ps))
		for _, po := range ps {
			committed[topic][po.Partition] = po.Offset
			if o.offsets[topic][po.Partition] == po.Offset { // not marked further meanwhile
				delete(o.offsets[topic], po.Partition)
			}
		}
		if len(o.offsets[topic]) == 0 {
			delete(o.offsets, topic)
		}
	}
	return committed, nil
}

// commit adds offs to the open transaction, fenced by gm, and commits it.
func (o *Owner) commit(prod sarama.SyncProducer, offs map[string][]*sarama.PartitionOffsetMetadata, gm *sarama.ConsumerGroupMetadata, records int) error {
	if len(offs) > 0 {
		gm.GroupInstanceID = o.instance
		if err := prod.AddOffsetsToTxnWithGroupMetadata(offs, gm); err != nil {
			return fmt.Errorf("txn: add offsets: %w", err)
		}
	}
	if o.BeforeCommit != nil {
		if err := o.BeforeCommit(records); err != nil {
			return fmt.Errorf("txn: before commit: %w", err)
		}
	}
	if err := prod.CommitTxn(); err != nil {
		return fmt.Errorf("txn: commit (generation %d): %w", gm.GenerationID, err)
	}
	return nil
}

// failLocked marks the owner broken until Reset (Hold fails, marks are
// dropped, Failed is closed) and returns err wrapping ErrBroken. The failed
// transaction is aborted, and a producer in a fatal state (fenced) closed,
// here only when gated, that is when the caller holds the gate exclusively
// (Commit): a Forward holds it shared, and other holders may be about to
// send on the same producer: sarama's abort races their sends (transitionTo
// writes lastError under statusLock, publishTxnPartitions reads it
// without), and a send to a closed producer panics. Otherwise the
// transaction stays open, in error, until Reset (the next session's Setup)
// or Close aborts it and drops a fatal producer, both holding the gate
// exclusively.
func (o *Owner) failLocked(err error, gated bool) error {
	if o.broken != nil { // failed meanwhile, by another forward
		return o.broken
	}
	st := o.prod.TxnStatus()
	if gated {
		if st&sarama.ProducerTxnFlagFatalError != 0 || o.open && o.prod.AbortTxn() != nil {
			o.dropProducerLocked()
		}
		o.open = false // aborted
	}
	o.records = 0
	clear(o.offsets)
	o.broken = fmt.Errorf("%w: %w", ErrBroken, err)
	close(o.failed)
	msg := "idem: Kafka transaction failed and aborted; the session restarts from the committed offsets"
	if o.open {
		msg += " (the abort runs before the session restarts)"
	}
	o.log.Warn(msg, "status", st.String(), "err", err)
	return o.broken
}

// Reset readies the owner for a new session: the marks of the previous one
// are dropped (a new session reads from the committed offsets), a failed
// transaction is forgotten and a producer dropped after a fatal error is made
// anew. Call it when no forward or commit of the previous session can still
// run (ConsumerGroupHandler.Setup). An error leaves the owner broken: call it
// again later.
func (o *Owner) Reset() error {
	o.gate.Lock()
	defer o.gate.Unlock()
	defer o.ended(false) // nothing of an earlier session's transaction commits any more
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.open && o.prod != nil { // not committed at the end of the last session: its records go again
		if err := o.prod.AbortTxn(); err != nil {
			o.dropProducerLocked()
		}
		o.open, o.records = false, 0
	}
	if o.prod != nil && o.prod.TxnStatus()&sarama.ProducerTxnFlagFatalError != 0 {
		o.dropProducerLocked() // fenced, or otherwise fatal: only a new producer goes on
	}
	clear(o.offsets)
	if o.prod == nil {
		if err := o.newProducer(); err != nil {
			if o.broken == nil {
				o.broken = fmt.Errorf("%w: %w", ErrBroken, err)
				close(o.failed)
			}
			return err
		}
	}
	if o.broken != nil {
		o.broken = nil
		o.failed = make(chan struct{})
	}
	return nil
}

// ended calls Ended, if set; the caller holds the gate exclusively.
func (o *Owner) ended(committed bool) {
	if o.Ended != nil {
		o.Ended(committed)
	}
}

// dropProducerLocked closes the producer; Reset makes a new one. The
// caller holds the gate exclusively: no Forward can be sending on it.
func (o *Owner) dropProducerLocked() {
	_ = o.prod.Close()
	o.prod, o.fwd = nil, nil
	o.open = false
}

// Close aborts the open transaction, if any (sarama's Close would leave it
// open and block read_committed readers of its partitions until the
// transaction timeout), and closes the producer. The client stays open.
func (o *Owner) Close() error {
	o.gate.Lock()
	defer o.gate.Unlock()
	defer o.ended(false)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.prod == nil {
		return nil
	}
	if o.open && o.prod.TxnStatus()&sarama.ProducerTxnFlagFatalError == 0 {
		_ = o.prod.AbortTxn()
	}
	o.open = false
	err := o.prod.Close()
	o.prod, o.fwd = nil, nil
	return err
}

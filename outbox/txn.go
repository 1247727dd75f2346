package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/mutate"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// This file is the relay's exactly-once mode (Relay.ExactlyOnce); Relay's
// doc, "Exactly once", gives the argument.

// txnState is the exactly-once state of one Run.
type txnState struct {
	id     string        // transactional.id, and the group of the progress mark
	client sarama.Client // shared by the producers and the mark reads
	// suspects are rows that were in a round Kafka failed with a rejection
	// (record too large for the topic, invalid record): each is published
	// alone until it commits or fails, so only the row at fault counts a
	// rejection.
	suspects map[int64]bool
}

// connectKafka makes what the relay publishes with: the producer (default
// mode), or the client the transactional producers are made from, with the
// transactional id (ExactlyOnce; each leadership makes its own producer).
func (s *session) connectKafka(ctx context.Context) error {
	c := s.cfg
	if !c.ExactlyOnce {
		p, err := sarama.NewAsyncProducer(c.Brokers, outboxstore.ProducerConfig(c.Sarama))
		if err != nil {
			return fmt.Errorf("outbox: producer for %v: %w", c.Brokers, err)
		}
		s.prod = p
		return nil
	}
	id := c.TransactionalID
	if id == "" {
		var err error
		if id, err = defaultTransactionalID(ctx, c.Pool, s.t); err != nil {
			return err
		}
	}
	client, err := sarama.NewClient(c.Brokers, txnConfig(c.Sarama, id))
	if err != nil {
		return fmt.Errorf("outbox: kafka client for %v: %w", c.Brokers, err)
	}
	s.txn = &txnState{id: id, client: client, suspects: map[int64]bool{}}
	return nil
}

// closeKafka closes what connectKafka made.
func (s *session) closeKafka() {
	if s.prod != nil {
		_ = s.prod.Close()
		s.prod = nil
	}
	if s.txn != nil {
		_ = s.txn.client.Close()
	}
}

// defaultTransactionalID is "idem-outbox-<table>-<hash>", the hash being
// that of the database cluster's system identifier, the database's name and
// the table's oid: the same for every relay of the table, different for
// every other table, whichever database it lives in.
func defaultTransactionalID(ctx context.Context, db dedupe.DB, t table) (string, error) {
	var sysID int64
	var dbName string
	var oid uint32
	err := db.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system()), current_database(), $1::regclass::oid`,
		t.quoted).Scan(&sysID, &dbName, &oid)
	if err != nil {
		return "", fmt.Errorf("outbox: derive the transactional id of %s (set Relay.TransactionalID to skip this): %w", t.quoted, err)
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s/%d", sysID, dbName, oid)
	return fmt.Sprintf("idem-outbox-%s-%016x", t.name, h.Sum64()), nil
}

// txnConfig is outboxstore.ProducerConfig(base) with the transactional id set.
func txnConfig(base *sarama.Config, id string) *sarama.Config {
	c := outboxstore.ProducerConfig(base)
	c.Producer.Transaction.ID = id
	return c
}

// txnRecover makes the leader's transactional producer, which fences every
// earlier producer of the transactional id (a zombie leader's commit then
// fails) and makes the coordinator finish or abort their open transaction;
// then it reads the progress mark and settles the rows of the round it names,
// the one round that may have committed without its rows being deleted.
// Kafka outages are retried here with backoff for as long as they last; it
// returns an error only when the database fails (the session then ends), or
// nil when ctx ends.
func (s *session) txnRecover(ctx context.Context, conn *pgx.Conn) error {
	s.closeTxnProducer()
	var mark int64
	for n := 1; ; n++ {
		err := s.newTxnProducer()
		if err == nil {
			mark, err = s.readMark(ctx)
		}
		if err == nil {
			s.cfg.Health.set(nil)
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		s.cfg.Health.set(err)
		wait := s.backoff(n)
		s.log.Warn("idem: outbox relay cannot start its Kafka transactions yet; retrying", "err", err, "attempt", n, "in", wait)
		if !pglead.Sleep(ctx, wait) {
			return nil
		}
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
	defer cancel()
	n, err := s.settleRound(actx, conn, mark)
	if err != nil {
		return err
	}
	s.log.Info("idem: outbox relay (exactly once): recovered", "transactional_id", s.txn.id, "committed_round", mark, "rows_settled", n)
	return nil
}

// newTxnProducer makes the transactional producer (InitProducerId).
func (s *session) newTxnProducer() error {
	p, err := sarama.NewAsyncProducerFromClient(s.txn.client)
	if err != nil {
		return fmt.Errorf("outbox: transactional producer %q: %w", s.txn.id, err)
	}
	s.prod = p
	return nil
}

// closeTxnProducer aborts the producer's open transaction, if any (Close
// would leave it open, blocking read_committed readers until it times out),
// and closes it.
func (s *session) closeTxnProducer() {
	if s.prod == nil {
		return
	}
	if st := s.prod.TxnStatus(); st&(sarama.ProducerTxnFlagInTransaction|sarama.ProducerTxnFlagAbortableError) != 0 &&
		st&sarama.ProducerTxnFlagFatalError == 0 {
		_ = s.prod.AbortTxn()
	}
	_ = s.prod.Close()
	s.prod = nil
}

// readMark returns the last committed round of the progress mark: the
// highest offset committed by the group s.txn.id on any partition (round
// numbers only grow), or -1 when there is none. It reads with RequireStable,
// so an offset of a transaction that is still being completed is waited
// for, never missed.
func (s *session) readMark(ctx context.Context) (int64, error) {
	client, group := s.txn.client, s.txn.id
	deadline := time.Now().Add(max(s.cfg.QueryTimeout, client.Config().Producer.Transaction.Timeout))
	for wait := 10 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		mark, retry, err := fetchMark(client, group)
		if !retry {
			return mark, err
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("outbox: read the progress mark of group %q: %w", group, err)
		}
		if !pglead.Sleep(ctx, wait) {
			return -1, ctx.Err()
		}
	}
}

// fetchMark is one OffsetFetch of every partition of group, with
// RequireStable. retry says the error is transient (coordinator moving, an
// offset commit of a transaction still in progress).
func fetchMark(client sarama.Client, group string) (mark int64, retry bool, err error) {
	coord, err := client.Coordinator(group)
	if err != nil {
		return -1, true, err
	}
	req := sarama.NewOffsetFetchRequest(client.Config().Version, group, nil) // nil: every partition
	req.RequireStable = true
	resp, err := coord.FetchOffset(req)
	if err != nil {
		_ = client.RefreshCoordinator(group)
		return -1, true, err
	}
	blocks, gerr := resp.Blocks, resp.Err
	if len(resp.Groups) > 0 {
		blocks, gerr = resp.Groups[0].Blocks, resp.Groups[0].Err
	}
	switch {
	case errors.Is(gerr, sarama.ErrNotCoordinatorForConsumer), errors.Is(gerr, sarama.ErrConsumerCoordinatorNotAvailable):
		_ = client.RefreshCoordinator(group)
		return -1, true, gerr
	case errors.Is(gerr, sarama.ErrOffsetsLoadInProgress):
		return -1, true, gerr
	case gerr != sarama.ErrNoError:
		return -1, false, fmt.Errorf("outbox: read the progress mark of group %q: %w", group, gerr)
	}
	mark = -1
	for topic, parts := range blocks {
		for p, b := range parts {
			switch {
			case errors.Is(b.Err, sarama.ErrUnstableOffsetCommit):
				return -1, true, fmt.Errorf("%s/%d: %w", topic, p, b.Err)
			case b.Err != sarama.ErrNoError:
				return -1, false, fmt.Errorf("outbox: read the progress mark of group %q (%s/%d): %w", group, topic, p, b.Err)
			}
			mark = max(mark, b.Offset)
		}
	}
	return mark, false, nil
}

// txnRound is round with ExactlyOnce: it records the heads under a new round
// number, publishes them and the mark (that number) in one Kafka transaction,
// and deletes them once it committed. A round that fails is aborted and its
// rows are published again by a later round; a round whose outcome is
// unknown (fatal producer error, commit that could not be confirmed) is
// settled by txnRecover from the mark.
func (s *session) txnRound(ctx context.Context, conn *pgx.Conn) (more bool, err error) {
	heads, more, err := s.fetch(ctx, conn)
	if err != nil || len(heads) == 0 {
		return false, err
	}
	if heads, err = s.openHeads(ctx, conn, heads); err != nil || len(heads) == 0 {
		return more, err
	}
	heads, err = s.screen(ctx, conn, heads)
	if err != nil || len(heads) == 0 {
		return more, err
	}
	ids := make([]int64, len(heads))
	for i, h := range heads {
		ids[i] = h.id
	}
	// The round's record commits before anything is published: a crash
	// after the commit finds the round's rows by the number the mark holds.
	var round int64
	if err := s.query(ctx, conn, `INSERT INTO `+s.t.rounds+` (ids) VALUES ($1) RETURNING round`, ids).Scan(&round); err != nil {
		return false, fmt.Errorf("outbox: record round: %w", err)
	}
	if err := s.prod.BeginTxn(); err != nil {
		s.log.Warn("idem: outbox relay could not begin a Kafka transaction; recreating its producer", "err", err)
		return true, s.txnRecover(ctx, conn)
	}
	errs := s.publish(heads)
	failedPublish := slices.ContainsFunc(errs, func(err error) bool { return err != nil })
	for i, err := range errs {
		switch {
		case errors.Is(err, sarama.ErrTransactionNotReady):
			errs[i] = nil // refused because another record had failed the transaction: not this row's failure
		case rejected(err) && len(heads) > 1:
			// Once a transaction fails, sarama fails the records that follow
			// with the first error: which row Kafka refused is unknown. Each
			// suspect goes alone in a round of its own, which tells.
			s.txn.suspects[heads[i].id] = true
			errs[i] = nil
		}
	}
	failed := s.failures(heads, errs)
	var cerr error
	if !failedPublish {
		cerr = s.commitRound(heads[0].topic, round, ids)
	}
	if !failedPublish && cerr == nil {
		// Kafka has the round: record it even if ctx was cancelled meanwhile.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
		defer cancel()
		if _, err := s.settleRound(actx, conn, round); err != nil {
			return false, err
		}
		for _, id := range ids {
			delete(s.txn.suspects, id)
		}
		for _, h := range heads {
			s.m.PublishSeconds.WithLabelValues(s.t.name).Observe(max(0, time.Since(h.due).Seconds()))
		}
		return more, nil
	}
	// Failed. A failed publish makes the transaction abortable (or fatal):
	// nothing of it committed. A failed commit may or may not have
	// committed: after the abort the mark says which.
	if len(failed) > 0 {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
		defer cancel()
		if err := s.settle(actx, conn, nil, failed); err != nil {
			return false, err
		}
		for _, f := range failed {
			if f.final {
				delete(s.txn.suspects, f.id)
			}
		}
	}
	if cerr != nil {
		s.m.PublishFailures.WithLabelValues(s.t.name, failureReason(cerr)).Add(float64(len(heads)))
	}
	st := s.prod.TxnStatus()
	if st&sarama.ProducerTxnFlagFatalError == 0 && s.prod.AbortTxn() == nil {
		if cerr == nil {
			return true, nil
		}
		mark, err := s.readMark(ctx)
		if err == nil && mark != round {
			s.log.Warn("idem: outbox round aborted; its rows go out in the next round", "round", round, "rows", len(heads), "err", cerr)
			return true, nil
		}
		if err == nil { // committed after all
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
			defer cancel()
			_, err := s.settleRound(actx, conn, round)
			return true, err
		}
	}
	s.log.Warn("idem: outbox round failed beyond an abort (producer fenced by another relay, fatal error or unconfirmed commit); recreating the producer and reading the progress mark",
		"round", round, "status", st.String(), "err", cerr)
	return true, s.txnRecover(ctx, conn)
}

// screen returns the heads a transaction can take, and records the others
// as failed publishes: rows whose topic the cluster does not have (an
// outage: it may be created later) and records larger than
// Producer.MaxMessageBytes (a rejection). In a transaction one such record
// would fail the whole round each time its retry comes, and hold every
// other row back. When a head is a suspect (see txnState.suspects), the
// round is that head alone.
func (s *session) screen(ctx context.Context, conn *pgx.Conn, heads []row) ([]row, error) {
	topicErr := map[string]error{}
	maxBytes := s.txn.client.Config().Producer.MaxMessageBytes
	var keep, out []row
	var errs []error
	for i, h := range heads {
		if _, seen := topicErr[h.topic]; !seen {
			_, err := s.txn.client.Partitions(h.topic)
			topicErr[h.topic] = err
		}
		err := topicErr[h.topic]
		if size := h.message(i).ByteSize(2); err == nil && size > maxBytes {
			err = sarama.ConfigurationError(fmt.Sprintf("record of %d bytes larger than Producer.MaxMessageBytes (%d)", size, maxBytes))
		}
		if err != nil {
			out, errs = append(out, h), append(errs, err)
		} else {
			keep = append(keep, h)
		}
	}
	for _, h := range keep {
		if s.txn.suspects[h.id] {
			keep = []row{h}
			break
		}
	}
	if len(out) == 0 {
		return keep, nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
	defer cancel()
	return keep, s.settle(actx, conn, nil, s.failures(out, errs))
}

// commitRound adds the progress mark (offset round, on partition 0 of topic,
// for the group s.txn.id) to the open transaction and commits it.
func (s *session) commitRound(topic string, round int64, ids []int64) error {
	if s.cfg.afterAck != nil {
		s.cfg.afterAck(ids)
	}
	md := "idem-outbox round " + strconv.FormatInt(round, 10)
	err := s.prod.AddOffsetsToTxn(map[string][]*sarama.PartitionOffsetMetadata{
		topic: {{Partition: 0, Offset: round, LeaderEpoch: -1, Metadata: &md}},
	}, s.txn.id)
	if err == nil && s.cfg.beforeCommit != nil {
		err = s.cfg.beforeCommit(round)
	}
	if err == nil {
		err = s.prod.CommitTxn()
	}
	if s.cfg.afterCommit != nil {
		s.cfg.afterCommit(round, err)
	}
	return err
}

// settleRound removes (or marks published) the pending rows of round, a
// round that committed, and forgets every round: the others never committed
// and their rows, still pending, go out in later rounds. A round of -1 (no
// mark) only forgets.
func (s *session) settleRound(ctx context.Context, conn *pgx.Conn, round int64) (int64, error) {
	rows := `(SELECT unnest(ids) FROM ` + s.t.rounds + ` WHERE round = $1)`
	q := "DELETE FROM " + s.t.quoted + " WHERE id IN " + rows + " AND state = 'pending'"
	if mutate.On(mutate.OutboxSettle) {
		q = "SELECT $1::bigint WHERE false" // the round's rows stay pending
	}
	if s.cfg.KeepPublished > 0 {
		q = "UPDATE " + s.t.quoted + " SET state = 'published', published_at = now(), retry_at = NULL WHERE id IN " + rows + " AND state = 'pending'"
	}
	b := &pgx.Batch{}
	settled := b.Queue(q, round)
	b.Queue("DELETE FROM " + s.t.rounds)
	var n int64
	settled.Exec(func(tag pgconn.CommandTag) error {
		n = tag.RowsAffected()
		return nil
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return 0, fmt.Errorf("outbox: settle committed round %d: %w", round, err)
	}
	s.m.Published.WithLabelValues(s.t.name).Add(float64(n))
	return n, nil
}

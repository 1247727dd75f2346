package outbox

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/outboxstore"
)

// Defaults of the Relay fields, applied when a field is zero.
const (
	defaultBatchSize     = outboxstore.BatchSize
	defaultPollInterval  = outboxstore.PollInterval
	defaultLeaderRetry   = outboxstore.LeaderRetry
	defaultMaxAttempts   = outboxstore.MaxAttempts
	defaultRetryBase     = 100 * time.Millisecond
	defaultRetryMax      = 30 * time.Second
	defaultSweepInterval = time.Minute
	defaultStatsInterval = 5 * time.Second
	defaultQueryTimeout  = 30 * time.Second
)

// Relay publishes the rows of one outbox table to Kafka. It is a plain
// configuration struct: Run does the work and keeps all state in its own
// stack, so one Relay value may be Run once at a time and copied freely.
//
// # Leadership
//
// Any number of relays may run for one table (one per service instance, say);
// exactly one publishes. Each holds a dedicated connection (taken out of Pool)
// on which it tries pg_try_advisory_lock(key of the table) every
// LeaderRetry. The holder publishes on that same connection: reads, deletes
// and LISTEN all run there, so a leader whose connection dies can no longer
// delete anything and loses the lock in the same instant. When the leader
// process dies, PostgreSQL ends its session and releases the lock; a standby
// takes over within LeaderRetry (plus the time PostgreSQL needs to notice a
// dead peer: immediate for a crashed process, tcp_keepalives_* for a host
// that vanished). The election is the one schedule.Scheduler runs too.
//
// # Publishing
//
// A round reads up to BatchSize pending rows in id order, takes the first
// row of each Kafka key (every keyless row), publishes them with an
// idempotent producer (acks=all, one in-flight request per broker), waits for
// every ack, then deletes the acked rows (or, with KeepPublished, marks them
// published and sweeps them later). A row is removed only after Kafka
// acknowledged it; a crash between the ack and the delete publishes it again,
// with the same idem-outbox-id, which idem consumers downstream drop as a
// duplicate. Delivery is at least once; with an idem consumer the effect is
// exactly once. With ExactlyOnce, delivery itself is exactly once for
// read_committed readers (see Exactly once).
//
// Per-key order: the next row of a key is read only after the row before it
// was acked and deleted, so a failing row of key K holds back every later row
// of K (its retry_at keeps the key out of the next rounds) while other keys
// flow on. One key therefore publishes at most one row per round (a few
// milliseconds); many keys publish BatchSize rows per round.
//
// # Delayed rows
//
// A row enqueued with Message.NotBefore in the future starts with retry_at =
// NotBefore, and every rule above applies to it as to a row waiting for a
// retry: it is not read before that time (compared with the database's
// now(), so relays on hosts with skewed clocks agree), and it holds back the
// later rows of its key, and only those, until it is published. A key's
// rows thus go out in enqueue order even when a later row is due first:
// per-key order is what downstream readers rely on (a "cancelled" must not
// overtake its "created"), and a rule that let due rows pass a delayed one
// would make the order depend on timing. Rows enqueued before the delayed one, and other
// keys, are not held. After each round that leaves the leader idle, it asks
// the database for the next time a waiting row comes due (the first
// retry_at, in time order, of a row no earlier row of its key holds back)
// and waits for a NOTIFY at most until then, or PollInterval when sooner: a
// delayed row goes out within a round's time of being due, and an idle
// leader does not poll faster than PollInterval. Each round reads its
// window from two index ranges (rows with no retry_at in id order, rows
// whose retry_at has come in time order), so neither a large number of rows
// scheduled for later nor a large backlog of undelayed rows makes a round
// read more than its window. idem_outbox_pending counts delayed rows;
// idem_outbox_oldest_pending_seconds and idem_outbox_publish_seconds count
// from a row's NotBefore when it is later than its insert, and the gauge
// leaves out the rows that may not go yet: delayed rows not due and the
// rows of their key held back behind them (the holder counts once due), so
// that it measures the relay's delay, not the one asked for. A relay of an
// idem version before NotBefore must not run on the same table: it would
// hold back the earlier rows of a key behind a later delayed one.
//
// # Never skipping a late commit
//
// Identity ids are taken at INSERT, not at COMMIT: a long transaction may
// hold id 5 while id 6 is already committed. A relay that remembered "done up
// to id 6" would pass over 5 for ever. The usual cure is to read only rows of
// transactions older than pg_snapshot_xmin(pg_current_snapshot()) (xid8
// column), at the price of stalling every event behind the longest-running
// transaction anywhere in the database. This relay needs neither: it keeps no
// high-water mark. Every round reads the pending rows from the lowest id up
// (a partial index on id WHERE state = 'pending' keeps that cheap because
// published rows leave it), so a row that commits late is simply pending at
// the next round after its commit, whatever its id. Its COMMIT also fires the
// table's NOTIFY, which starts that round at once. Rows of one key keep their
// order because a transaction that starts after another committed draws
// higher ids; only concurrent transactions, which have no order, may be
// published in commit order rather than id order. TestLateCommitNotSkipped
// provokes the race.
//
// # Bad input and outages
//
// A failed publish is retried with exponential backoff and full jitter
// (RetryBase, RetryMax, counted by the row's attempts). Only a rejection of
// the record itself (too large for the producer or the topic, a record the
// broker finds invalid) counts against the row, in its own count
// (rejections): after MaxAttempts of them the row moves to the failed state
// with its last error and stops holding back its key. `idem outbox list
// --failed` shows failed rows and `idem outbox retry` (Retry) makes them
// pending again. Every other error is an outage and is retried for as long
// as it lasts without counting against the row: brokers unreachable,
// timeouts, SASL authentication, cluster or topic authorization, an unknown
// topic. Those concern every row of a cluster or a topic, not one row: a
// credential rotation or a topic created after its first events must not
// fail every head row (which would break per-key order). Such a row keeps
// holding back its key and waits, visible in
// idem_outbox_publish_failures_total{reason} and idem_outbox_oldest_pending_seconds.
// Nothing unpublished is ever deleted.
//
// # Exactly once
//
// The default relay publishes at least once: a leader that dies between
// Kafka's ack and the delete leaves rows that the next leader sends again.
// With ExactlyOnce, a round is:
//
//  1. record: the ids of the heads go into a new row of <table>_rounds,
//     whose identity is the round number; this commits before anything is
//     sent;
//  2. publish, in one Kafka transaction (transactional.id TransactionalID):
//     the records, and the progress mark, an offset of the consumer group
//     TransactionalID on partition 0 of the round's first topic whose value
//     is the round number (AddOffsetsToTxn); then CommitTxn;
//  3. delete (or mark published) the round's rows.
//
// A leader makes its transactional producer each time it takes the lock,
// then reads the mark (OffsetFetch with RequireStable: the highest offset
// the group holds), deletes the rows of the round it names, and forgets
// every round record. Why no row is sent twice or lost:
//
//   - Making the producer (InitProducerId) fences every earlier producer of
//     the transactional id: a zombie leader's commit fails from then on,
//     and the coordinator first completes or aborts the transaction it had
//     open. So no earlier round can commit once the new leader reads the
//     mark, and RequireStable makes the read wait for a commit still being
//     written. Rounds commit one after the other (one transaction at a
//     time, each leader fencing the one before), and round numbers only
//     grow and are never reused, so the mark is the last round that
//     committed: M.
//   - A leader deletes a round's rows before it starts the next round, and
//     a leader that fails before the delete goes through this recovery
//     first. So the only published rows left in the table are those of
//     round M, and they are exactly the records of M's transaction: the
//     round's record commits before the records are sent, and a transaction
//     with a failed record is aborted, never committed in part. The new
//     leader deletes them: not sent again.
//   - Every other recorded round was aborted or never committed; its rows
//     are pending like any other and a later round publishes them: not
//     lost. Per-key order holds as before, since the next row of a
//     key is read only after the previous one's round committed and its rows
//     were deleted.
//   - A mark that is lost (offsets expire offsets.retention.minutes, 7 days
//     by default, after a round's commit; the topic that held it is
//     deleted) can only make the last round's rows go out again, never lose
//     one: a mark that names no recorded round deletes nothing.
//
// Failures: a failed record makes sarama's transaction abortable; the relay
// aborts it and the rows go out in the next round (the failed row with its
// backoff, counted as for the default relay). A failed commit may or may not
// have committed: the relay aborts and reads the mark to know. When it
// cannot abort (a fatal error, a producer fenced by another relay, a commit
// whose outcome cannot be confirmed) it makes a new producer and recovers
// from the mark as a new leader does. Rows for a topic the cluster does not
// have and records larger than Producer.MaxMessageBytes are kept out of the
// transactions, since each would fail every round it is in; when the broker
// refuses a record (too large for the topic, invalid), the rows of that
// round are then published one per round until the one at fault is found,
// and only it counts the rejection. TestExactlyOnceSurvivesSIGKILL,
// TestExactlyOnceFencesAZombie and TestExactlyOnceAbortsAndRetries show it.
//
// What it promises and costs:
//
//   - Exactly once holds for readers with isolation.level=read_committed
//     (sarama: Consumer.IsolationLevel = sarama.ReadCommitted). Others may
//     see the records of aborted rounds.
//   - Each round costs one more statement (the round's record) and the
//     transaction's requests: AddPartitionsToTxn, AddOffsetsToTxn,
//     TxnOffsetCommit, EndTxn, and a commit marker in every partition of the
//     round; about 5 ms a round here, so it matters for small rounds. The
//     records of a round are sent one at a time, each acknowledged before
//     the next (see the last point): on a shared 2-core machine (load
//     average 4 to 5), BenchmarkRelayBacklog (50,000 rows, BatchSize 500)
//     measured 2,300 to 3,200 events/s, against 20,800 to 24,400 when a
//     round's records were sent all at once (and, under a heavier load,
//     the default's 5,300 to 10,800), and BenchmarkRelayLatency at 1,000 events/s a
//     COMMIT-to-read_committed-reader latency of p50 20 to 37 ms, p99 190
//     to 281 ms (default: 11 to 14 ms, 75 to 180 ms): a reader sees a round
//     only once its commit marker is written.
//   - A relay that dies inside a transaction holds back read_committed
//     readers of the round's partitions until a standby takes over (its
//     producer aborts that transaction at once) or the transaction times out
//     (Sarama.Producer.Transaction.Timeout, sarama's default 1m).
//   - The group TransactionalID shows in consumer-group listings with one
//     offset per topic (a round number, not a position).
//   - Kafka 2.5 or later (Sarama.Version); ACLs: WRITE on the transactional
//     id, READ on the group.
//   - sarama v1.61.1 has a data race on its transactional error path: when a
//     transaction fails with records still being sent, it reads the
//     transaction's last error in one goroutine while a retry writes it in
//     another (IBM/sarama#2913, open; no later version fixes it). So the
//     relay never has two records of a transaction in flight: it sends a
//     round's records one at a time and stops at the first that fails,
//     which also names the row at fault at once. That costs throughput
//     (above); a backlog drains at a few thousand events a second.
type Relay struct {
	// Pool is the database of the outbox table. Required. The relay takes
	// one connection out of it for good (its lock and LISTEN connection),
	// and keeps its session settings (search_path, ...). Session advisory
	// locks and LISTEN need a direct connection or a session-mode pooler
	// (not PgBouncer's transaction mode).
	Pool *pgxpool.Pool

	// Brokers are the Kafka bootstrap addresses, "host:port". Required.
	Brokers []string

	// Sarama is the base sarama config (TLS, SASL, client id). The relay
	// copies it and sets what its guarantees depend on: an idempotent
	// producer with acks=all, one in-flight request per connection, no topic
	// auto-creation, sarama's hash partitioner, and Version when left at
	// sarama's default; with ExactlyOnce, also Producer.Transaction.ID
	// (TransactionalID).
	// Default: sarama.NewConfig().
	Sarama *sarama.Config

	// Table is the outbox table, optionally "schema.table".
	// Default: "idem_outbox".
	Table string

	// BatchSize is the most rows one round reads.
	// Default: 500.
	BatchSize int

	// PollInterval is how long an idle leader waits for a NOTIFY before it
	// looks at the table anyway (a fallback: NOTIFY wakes it at each commit).
	// A timer wakes it sooner when a delayed row (Message.NotBefore) or a
	// failed row's retry comes due first.
	// Default: 1s.
	PollInterval time.Duration

	// LeaderRetry is how often a standby tries to take the lock, and the
	// first wait before a relay tries again to start (migrate, make its
	// producer) or to reconnect after losing its connection; those waits
	// double with each failure in a row, with jitter, up to RetryMax.
	// Default: 1s.
	LeaderRetry time.Duration

	// MaxAttempts is how many publishes of a row Kafka may reject for the
	// record itself (too large, invalid record) before the row moves to the
	// failed state. Outages (brokers down, authentication, authorization,
	// unknown topic) are retried and never count.
	// Default: 10.
	MaxAttempts int

	// RetryBase and RetryMax shape the wait before a failed row is tried
	// again: a uniformly random time in [0, min(RetryMax,
	// RetryBase*2^(attempts-1))].
	// Default: RetryBase 100ms.
	RetryBase time.Duration
	// RetryMax caps the retry wait (see RetryBase).
	// Default: 30s.
	RetryMax time.Duration

	// KeepPublished, when positive, marks acked rows published instead of
	// deleting them, and deletes them KeepPublished after publication (an
	// audit trail). Zero deletes acked rows at once.
	// Default: 0.
	KeepPublished time.Duration

	// SweepInterval is how often the leader deletes published rows older
	// than KeepPublished (unused when KeepPublished is 0).
	// Default: 1m.
	SweepInterval time.Duration

	// StatsInterval is how often the leader refreshes the pending, oldest
	// pending and failed gauges.
	// Default: 5s.
	StatsInterval time.Duration

	// QueryTimeout bounds each statement on the relay's connection; a
	// statement that times out closes the connection (the relay reconnects).
	// Default: 30s.
	QueryTimeout time.Duration

	// Logger receives the relay's logs.
	// Default: slog.Default().
	Logger *slog.Logger

	// Registerer receives the idem_outbox_* collectors (package metrics).
	// Default: nil, metrics are kept but not exported.
	Registerer prometheus.Registerer

	// Health, when set, receives the relay's state while Run runs, for a
	// readiness probe (see Health.Err). Run never reads it otherwise.
	// Default: nil.
	Health *Health

	// TracerProvider makes the tracer of the relay's spans: one
	// "idem.outbox.publish" span (kind producer) per row published, a child
	// of the trace context Enqueue stored with the row (the handler's span)
	// and linked to it, ended at Kafka's ack or error. The record carries
	// the span's own context (traceparent, tracestate), so the consumer of
	// the event continues the trace. Attributes: messaging.system,
	// messaging.operation.type "send", messaging.destination.name,
	// messaging.message.id (the event id), idem.outbox.table, idem.outbox.id,
	// idem.correlation_id (when the row has one), and at the ack
	// messaging.destination.partition.id and messaging.kafka.offset.
	// Default: otel.GetTracerProvider() (a no-op until the program installs
	// an SDK; the records then still carry the enqueue's trace context).
	TracerProvider trace.TracerProvider

	// Propagator reads the trace context from a row's stored headers and
	// writes the publish span's into the record.
	// Default: propagation.TraceContext{} (W3C, as consumer.Config's).
	Propagator propagation.TextMapPropagator

	// ExactlyOnce publishes each round in a Kafka transaction that also
	// commits the relay's progress mark, so that after a crash at any point
	// each row reaches read_committed readers exactly once (see "Exactly
	// once" above for the argument and the cost: fewer events/s, more
	// latency). Readers that use read_uncommitted (sarama's default) may
	// still see the records of aborted rounds. Off, the relay publishes at
	// least once. Every relay of a table must agree on it.
	// Default: false.
	ExactlyOnce bool

	// TransactionalID is, with ExactlyOnce, the Kafka transactional.id of
	// the relay's producer and the consumer group that holds its progress
	// mark. Every relay of one table must use the same value (a new leader
	// fences the old one through it), and no two tables, in this database
	// or another, may share it on one Kafka cluster: they would fence each
	// other and read each other's mark. When empty, the relay derives
	// "idem-outbox-<table>-<hash>", the hash being that of the database
	// cluster's system identifier, the database name and the table's oid,
	// which is the same for every relay of the table and differs between
	// tables. The relay needs WRITE on the transactional id, READ on the
	// group and DESCRIBE on the topics where ACLs are enforced.
	// Default: computed at Run.
	TransactionalID string

	// EncryptionKeyFile names a file holding the key-encryption key (KEK)
	// of payload encryption at rest (`idem keys generate` writes one; mode
	// 600). With it, Relay.Enqueue seals each row's value and headers under
	// the outbox's data keys (purpose "outbox" of idem_seal_keys), and Run
	// opens them before it publishes: the record is published as it was
	// enqueued. A row whose data key was destroyed (`idem keys destroy`),
	// or that does not authenticate, is never published: it moves to the
	// failed state with the reason as its last_error (`idem outbox list
	// --failed`; idem_outbox_publish_failures_total{reason="unreadable"}). A
	// sealed row read by a relay without a key waits (retried, reason
	// "no_key"). Run refuses a file others may read, and returns an error
	// for a KEK that does not unwrap the outbox's data keys. Rows enqueued
	// in clear (Enqueue, or before the key was given) publish as ever.
	// Default: "" (rows stored in clear).
	EncryptionKeyFile string
	// EncryptionKey is EncryptionKeyFile's content given directly, e.g.
	// from an environment variable. Give one of the two.
	// Default: "".
	EncryptionKey string

	// idle, when set (tests only), runs each time an idle leader is about
	// to wait, with how long it will wait at most.
	idle func(wait time.Duration)
	// afterAck, when set (tests only), runs after a round's acks and before
	// its rows are deleted; with ExactlyOnce, before the round commits.
	afterAck func(ids []int64)
	// afterCommit, when set (tests only, ExactlyOnce), runs after CommitTxn
	// returned err and before the round's rows are deleted.
	afterCommit func(round int64, err error)
	// beforeCommit, when set (tests only, ExactlyOnce), runs before
	// CommitTxn; an error aborts the round as an abortable error would.
	beforeCommit func(round int64) error
}

// Validate reports every bad field at once (errors.Join), each naming the
// field, its value and the rule, every one matching ErrInvalidConfig. Zero
// fields count as their defaults. Run calls it.
func (r *Relay) Validate() error {
	if r == nil {
		return fmt.Errorf("%w: nil Relay", ErrInvalidConfig)
	}
	c := r.withDefaults()
	l := configerr.New(ErrInvalidConfig, "Relay.")
	if c.Pool == nil {
		l.Bad("Pool", nil, "required")
	}
	if len(c.Brokers) == 0 {
		l.Bad("Brokers", c.Brokers, "at least one host:port required")
	}
	if c.BatchSize < 0 {
		l.Bad("BatchSize", c.BatchSize, "must be >= 0 (0: the default)")
	}
	if c.MaxAttempts < 0 {
		l.Bad("MaxAttempts", c.MaxAttempts, "must be >= 0 (0: the default)")
	}
	if c.EncryptionKeyFile != "" && c.EncryptionKey != "" {
		l.Bad("EncryptionKey", "(set)", "give the key-encryption key in EncryptionKeyFile or EncryptionKey, not both")
	}
	l.NonNegative(map[string]time.Duration{"PollInterval": c.PollInterval, "LeaderRetry": c.LeaderRetry,
		"RetryBase": c.RetryBase, "RetryMax": c.RetryMax, "KeepPublished": c.KeepPublished,
		"SweepInterval": c.SweepInterval, "StatsInterval": c.StatsInterval, "QueryTimeout": c.QueryTimeout})
	if c.RetryBase > c.RetryMax {
		l.Bad("RetryBase", c.RetryBase, fmt.Sprintf("must not exceed RetryMax (%s)", c.RetryMax))
	}
	if _, err := parseTable(c.Table); err != nil {
		l.Add(fmt.Errorf("Relay.Table: %w", err))
	}
	l.Check("Sarama", outboxstore.ProducerConfig(r.Sarama).Validate())
	if c.ExactlyOnce {
		if v := outboxstore.ProducerConfig(r.Sarama).Version; !v.IsAtLeast(sarama.V2_5_0_0) {
			l.Bad("Sarama.Version", v, "ExactlyOnce needs Kafka 2.5 or later")
		} else {
			l.Check("Sarama (ExactlyOnce)", txnConfig(r.Sarama, "idem-outbox-validate").Validate())
		}
	}
	return l.Err()
}

// withDefaults returns a copy with every zero field set to its default.
func (r *Relay) withDefaults() Relay {
	c := *r
	setDefault(&c.Table, defaultTable)
	setDefault(&c.BatchSize, defaultBatchSize)
	setDefault(&c.PollInterval, defaultPollInterval)
	setDefault(&c.LeaderRetry, defaultLeaderRetry)
	setDefault(&c.MaxAttempts, defaultMaxAttempts)
	setDefault(&c.RetryBase, defaultRetryBase)
	setDefault(&c.RetryMax, defaultRetryMax)
	setDefault(&c.SweepInterval, defaultSweepInterval)
	setDefault(&c.StatsInterval, defaultStatsInterval)
	setDefault(&c.QueryTimeout, defaultQueryTimeout)
	if c.Sarama == nil {
		c.Sarama = sarama.NewConfig()
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	return c
}

func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
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

// Run relays until ctx is cancelled, then returns nil once its connection,
// producer and every goroutine it started are gone. It returns an error only
// for an invalid configuration (Validate) or metrics it cannot register.
//
// Nothing else stops it: not at start, not later. It first creates or
// upgrades its table (as idem.Migrate does) and makes its producer; while either fails
// (the database or the brokers are down, a migration lock is held, the
// credentials are being rotated) it logs the failure at WARN and tries again
// after a backoff with jitter: a random wait in [c/2, c], c =
// min(RetryMax, LeaderRetry·2^(n-1)) after the n-th failure in a row. Once
// started, lost database connections and Kafka outages are retried the same
// way for as long as they last. Health, when set, tells a readiness probe
// which of these it is in.
func (r *Relay) Run(ctx context.Context) error {
	if err := r.Validate(); err != nil {
		return err
	}
	c := r.withDefaults()
	t, _ := parseTable(c.Table)
	m, err := newCollectors(c.Registerer)
	if err != nil {
		return fmt.Errorf("outbox: register metrics: %w", err)
	}
	keks, err := seal.LoadKEKs(c.EncryptionKeyFile, c.EncryptionKey)
	if err != nil {
		return fmt.Errorf("outbox: encryption key: %w", err)
	}
	s := &session{
		cfg:    c,
		t:      t,
		m:      m,
		keks:   keks,
		log:    c.Logger.With("outbox", t.name),
		rand:   rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		tracer: c.TracerProvider.Tracer(tracerName),
	}
	s.leader = m.Leader.WithLabelValues(t.name)
	s.leader.Set(0)
	// The published counter and the publish latency exist from the start,
	// at zero, on a standby too: a dashboard or alert that reads them finds
	// a series for every relay, not only once this one has led and published.
	m.Published.WithLabelValues(t.name)
	m.PublishSeconds.WithLabelValues(t.name)
	c.Health.set(errNotStarted)
	defer c.Health.set(errStopped)
	defer s.closeKafka()
	e := &pglead.Election{
		Pool: c.Pool, Name: "outbox relay", Table: t.quoted, Log: s.log,
		Key:     func(oid uint32) int64 { return lockNamespace<<32 | int64(oid) },
		Channel: channel,
		Retry:   c.LeaderRetry, RetryMax: c.RetryMax, Timeout: c.QueryTimeout,
		Start:  s.start,
		Lead:   s.lead,
		Leader: s.leader,
		Health: c.Health.set,
	}
	e.Run(ctx)
	return s.fatal
}

// start migrates the table, reads the data keys (with a key) and makes the
// producer, once; the election retries it with backoff until it succeeds,
// or gives up on a key that does not unwrap the outbox's data keys.
func (s *session) start(ctx context.Context) error {
	if err := outboxstore.Migrate(ctx, s.cfg.Pool, s.cfg.Table); err != nil {
		return err
	}
	if err := s.startSealer(ctx); err != nil {
		return err
	}
	return s.connectKafka(ctx)
}

// backoff is the wait after the n-th failure in a row of the relay's
// start-up or session: a random duration in [c/2, c], c = min(RetryMax,
// LeaderRetry·2^(n-1)).
func (s *session) backoff(n int) time.Duration {
	return pglead.Backoff(n, s.cfg.LeaderRetry, s.cfg.RetryMax)
}

// Errors Health.Err returns while the relay is not running.
var (
	// errNotStarted: Run has not yet migrated the table and made its
	// producer (the last failure, if any, is returned instead).
	errNotStarted = errors.New("outbox: relay not started")
	// errStopped: Run has returned.
	errStopped = errors.New("outbox: relay stopped")
)

// Health is a running relay's state, for a readiness probe: set
// Relay.Health to a *Health and call Err. The zero value is ready for use;
// it is safe for concurrent use.
type Health struct {
	mu  sync.Mutex
	err error
}

// Err returns nil while the relay runs with its table migrated and its
// producer made, connected to the database (leading or standing by), and
// otherwise why not: that it has not started yet or has stopped, or the last
// start-up or connection error (a relay retries those by itself).
func (h *Health) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *Health) set(err error) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

// session is one Run's state.
type session struct {
	cfg    Relay
	t      table
	m      *collectors
	leader prometheus.Gauge
	prod   sarama.AsyncProducer // with ExactlyOnce, made anew at each leadership
	log    *slog.Logger
	txn    *txnState // ExactlyOnce only
	rand   *rand.Rand
	tracer trace.Tracer
	keks   []seal.KEK   // EncryptionKeyFile's or EncryptionKey's; nil: none
	sealer *seal.Sealer // opens sealed rows (made by start); nil without keks
	fatal  error        // why start gave up for good (a wrong KEK); Run returns it
}

// lockNamespace is the high half of the advisory lock key ("idox"); the low
// half is the table's oid, so each outbox table has its own lock.
const lockNamespace int64 = 0x69646f78

func channel(oid uint32) string { return fmt.Sprintf("idem_outbox_%d", oid) }

// lead publishes until the connection fails (error) or ctx ends (nil).
func (s *session) lead(ctx context.Context, conn *pgx.Conn) error {
	round := s.round
	if s.txn != nil {
		defer s.closeTxnProducer()
		if err := s.txnRecover(ctx, conn); err != nil || ctx.Err() != nil {
			return err
		}
		round = s.txnRound
	}
	var nextStats time.Time
	nextSweep := time.Now()
	for {
		more, err := round(ctx, conn)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if now := time.Now(); !now.Before(nextStats) {
			if err := s.stats(ctx, conn); err != nil {
				return err
			}
			nextStats = now.Add(s.cfg.StatsInterval)
		}
		if now := time.Now(); s.cfg.KeepPublished > 0 && !now.Before(nextSweep) {
			if err := s.sweep(ctx, conn); err != nil {
				return err
			}
			nextSweep = now.Add(s.cfg.SweepInterval)
		}
		if more {
			continue
		}
		wait, err := s.idleWait(ctx, conn)
		if err != nil {
			return err
		}
		if s.cfg.idle != nil {
			s.cfg.idle(wait)
		}
		if err := pglead.Wait(ctx, conn, wait); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("outbox: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// idleWait is how long the leader may wait for a NOTIFY: PollInterval, or
// less when a waiting row (a NotBefore, a failed row's retry) comes due
// sooner. A row that is due but held back by an earlier waiting row of its
// key does not count (its holder's time does), or the leader would spin
// until the holder is due. The retry index is read in time order and the
// walk stops at the first row not held back.
func (s *session) idleWait(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	var next *float64
	err := s.query(ctx, conn, `SELECT extract(epoch FROM o.retry_at - now())::float8 FROM `+s.t.quoted+` o
		WHERE o.state = 'pending' AND o.retry_at IS NOT NULL AND `+fmt.Sprintf(notHeldSQL, s.t.quoted)+`
		ORDER BY o.retry_at LIMIT 1`).Scan(&next)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("outbox: next retry: %w", err)
	}
	return pglead.Until(next, s.cfg.PollInterval), nil
}

// row is one pending outbox row.
type row struct {
	id       int64
	eventID  string
	topic    string
	key      []byte
	value    []byte
	hkeys    []string
	hvals    [][]byte
	attempts int
	rejects  int
	due      time.Time // created_at, or not_before when later
	waited   bool      // it had a retry_at (a NotBefore, a retry)
	keyID    *int64    // the data key of sealed; nil: value and headers in clear
	sealed   []byte    // value and headers sealed at rest (Relay.Enqueue)
}

// round publishes the heads of the first BatchSize publishable rows. more
// says another round may find work at once.
func (s *session) round(ctx context.Context, conn *pgx.Conn) (more bool, err error) {
	heads, more, err := s.fetch(ctx, conn)
	if err != nil || len(heads) == 0 {
		return false, err
	}
	if heads, err = s.openHeads(ctx, conn, heads); err != nil || len(heads) == 0 {
		return more, err
	}
	errs := s.publish(heads)

	var acked []int64
	for i, h := range heads {
		if errs[i] == nil {
			acked = append(acked, h.id)
			s.m.PublishSeconds.WithLabelValues(s.t.name).Observe(max(0, time.Since(h.due).Seconds()))
		}
	}
	failed := s.failures(heads, errs)
	if s.cfg.afterAck != nil {
		s.cfg.afterAck(acked)
	}
	// Kafka has the acked rows: record it even if ctx was cancelled meanwhile,
	// or a clean shutdown would publish them again.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
	defer cancel()
	if err := s.settle(actx, conn, acked, failed); err != nil {
		return false, err
	}
	s.m.Published.WithLabelValues(s.t.name).Add(float64(len(acked)))
	return more, nil
}

// fetchSQL reads a window of up to $1 publishable pending rows in id order
// (rows whose retry time, if any, has come, and that no earlier waiting row
// of their key holds back) and returns, values included, only each key's
// first row of the window and every keyless row, with whether the row was
// waiting (had a retry_at) and the window's size. The window is the lowest
// ids of two ranges, each read in the order of its own index so that
// neither walks past rows it does not want: rows with no retry_at in id
// order (most rows), and rows whose retry_at has come in time order (rows
// scheduled for later are never visited, nor is the backlog of undelayed
// rows). Taking the second range in time order rather than id order may
// leave a due row out of a window that holds a later id; per-key order
// still holds because a waiting row, due or not, holds back every later row
// of its key until it is published (%[2]s). A delayed row never holds back
// the rows enqueued before it.
const fetchSQL = `
WITH w AS (
  SELECT id, key, row_number() OVER (PARTITION BY key ORDER BY id) AS nth
  FROM (
    SELECT id, key FROM (
      (SELECT id, key FROM %[1]s o
       WHERE state = 'pending' AND retry_at IS NULL AND %[2]s
       ORDER BY id LIMIT $1)
      UNION ALL
      (SELECT id, key FROM %[1]s o
       WHERE state = 'pending' AND retry_at IS NOT NULL AND retry_at <= now() AND %[2]s
       ORDER BY retry_at LIMIT $1)) ranges
    ORDER BY id
    LIMIT $1) window_rows
)
SELECT o.id, o.event_id::text, o.topic, o.key, o.value, o.header_keys, o.header_values, o.attempts, o.rejections,
       greatest(o.created_at, o.not_before), o.retry_at IS NOT NULL, (SELECT count(*) FROM w), o.key_id, o.sealed
FROM %[1]s o JOIN w ON w.id = o.id
WHERE w.nth = 1 OR w.key IS NULL
ORDER BY o.id`

// notHeldSQL is true for a row o of the table %[1]s that no earlier pending
// row of its key holds back: one that waits (has a retry_at: its NotBefore,
// or its retry after a failed publish), due or not. One probe of the held
// index, which holds only waiting rows.
const notHeldSQL = `(o.key IS NULL OR NOT EXISTS (
  SELECT 1 FROM %[1]s h
  WHERE h.state = 'pending' AND h.retry_at IS NOT NULL AND h.key = o.key AND h.id < o.id))`

// fetchSQL is fetchSQL for table t.
func (t table) fetchSQL() string {
	return fmt.Sprintf(fetchSQL, t.quoted, fmt.Sprintf(notHeldSQL, t.quoted))
}

// fetch returns the heads of the next window (see fetchSQL) in id order.
// more says another round may find work at once: the window was full, or
// it held rows behind their key's head, or a head was a waiting row, whose
// key's later rows it kept out of the window.
func (s *session) fetch(ctx context.Context, conn *pgx.Conn) (heads []row, more bool, err error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rs, err := conn.Query(qctx, s.t.fetchSQL(), s.cfg.BatchSize)
	if err != nil {
		return nil, false, fmt.Errorf("outbox: read %s: %w", s.t.quoted, err)
	}
	var window int
	heads, err = pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.eventID, &x.topic, &x.key, &x.value, &x.hkeys, &x.hvals, &x.attempts, &x.rejects, &x.due, &x.waited, &window,
			&x.keyID, &x.sealed)
		return x, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("outbox: read %s: %w", s.t.quoted, err)
	}
	more = window == s.cfg.BatchSize || len(heads) < window || slices.ContainsFunc(heads, func(r row) bool { return r.waited })
	return heads, more, nil
}

// publish sends heads, each in its publish span, and waits for every ack or
// error; errs[i] is heads[i]'s.
func (s *session) publish(heads []row) []error {
	errs := make([]error, len(heads))
	msgs := make([]*sarama.ProducerMessage, len(heads))
	spans := make([]trace.Span, len(heads))
	for i := range heads {
		h := heads[i] // a copy: the span's context goes into the record, not the row
		h.hkeys, h.hvals = slices.Clone(h.hkeys), slices.Clone(h.hvals)
		spans[i] = s.publishSpan(&h)
		msgs[i] = h.message(i)
	}
	if s.txn != nil {
		return s.publishInTurn(msgs, spans)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, m := range msgs {
			s.prod.Input() <- m
		}
	})
	for range heads {
		select {
		case m := <-s.prod.Successes():
			i := m.Metadata.(int)
			errs[i] = nil
			endPublishSpan(spans[i], m.Partition, m.Offset, nil)
		case e := <-s.prod.Errors():
			i := e.Msg.Metadata.(int)
			errs[i] = e.Err
			endPublishSpan(spans[i], e.Msg.Partition, -1, e.Err)
		}
	}
	wg.Wait()
	return errs
}

// publishInTurn is publish with ExactlyOnce: one record in the producer at
// a time, and none after one failed (the transaction is lost; the rest are
// given sarama.ErrTransactionNotReady, not their failure). sarama v1.61.1
// races when a transaction fails with records in flight: it reads the
// transaction's last error in one goroutine while a failing record's retry
// or return writes it in another (IBM/sarama#2913; the swarm's -race
// members met it, issue 28). With one record in flight, a failure has
// nothing to race with.
func (s *session) publishInTurn(msgs []*sarama.ProducerMessage, spans []trace.Span) []error {
	errs := make([]error, len(msgs))
	failed := false
	for i, m := range msgs {
		if failed {
			errs[i] = sarama.ErrTransactionNotReady
			endPublishSpan(spans[i], m.Partition, -1, errs[i])
			continue
		}
		s.prod.Input() <- m
		select {
		case ok := <-s.prod.Successes():
			endPublishSpan(spans[i], ok.Partition, ok.Offset, nil)
		case e := <-s.prod.Errors():
			errs[i], failed = e.Err, true
			endPublishSpan(spans[i], e.Msg.Partition, -1, e.Err)
		}
	}
	return errs
}

// message builds row r's record; meta is its index in the round.
func (r row) message(meta int) *sarama.ProducerMessage {
	m := &sarama.ProducerMessage{Topic: r.topic, Metadata: meta}
	if r.key != nil {
		m.Key = sarama.ByteEncoder(r.key)
	}
	if r.value != nil {
		m.Value = sarama.ByteEncoder(r.value)
	}
	hasKey := false
	m.Headers = make([]sarama.RecordHeader, 0, len(r.hkeys)+2)
	for i, k := range r.hkeys {
		if k == outboxstore.HeaderID {
			continue // the relay's own, set below
		}
		hasKey = hasKey || k == HeaderIdempotencyKey
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(k), Value: r.hvals[i]})
	}
	m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(outboxstore.HeaderID), Value: []byte(r.eventID)})
	if !hasKey {
		m.Headers = append(m.Headers, sarama.RecordHeader{Key: []byte(HeaderIdempotencyKey), Value: []byte(r.eventID)})
	}
	return m
}

// failure is a row whose publish failed this round.
type failure struct {
	id       int64
	err      string
	wait     time.Duration
	reason   string
	rejected bool // Kafka refused the record itself: counts towards MaxAttempts
	final    bool // the row moves to the failed state
}

// failures classifies the round's failed publishes, and logs each rejection
// and one line for the round's outages.
func (s *session) failures(heads []row, errs []error) []failure {
	var out []failure
	var outages int
	var firstOutage error
	for i, h := range heads {
		err := errs[i]
		if err == nil {
			continue
		}
		f := s.failure(h, err)
		out = append(out, f)
		switch {
		case f.final:
			s.log.Error("idem: outbox row failed for good; `idem outbox retry` sends it again",
				"id", h.id, "topic", h.topic, "rejections", h.rejects+1, "reason", f.reason, "err", err)
		case f.rejected:
			s.log.Warn("idem: Kafka rejected an outbox row; will retry", "id", h.id, "topic", h.topic,
				"rejections", h.rejects+1, "max", s.cfg.MaxAttempts, "reason", f.reason, "err", err, "in", f.wait)
		default:
			if outages == 0 {
				firstOutage = err
			}
			outages++
		}
	}
	if outages > 0 {
		s.log.Warn("idem: outbox publish failed (outage: brokers, credentials, authorization or topic); will retry, not counted against the rows",
			"rows", outages, "err", firstOutage)
	}
	return out
}

func (s *session) failure(r row, err error) failure {
	reason := failureReason(err)
	s.m.PublishFailures.WithLabelValues(s.t.name, reason).Inc()
	f := failure{id: r.id, err: err.Error(), reason: reason, rejected: rejected(err), wait: s.retryWait(r.attempts + 1)}
	f.final = f.rejected && r.rejects+1 >= s.cfg.MaxAttempts
	return f
}

// retryWait is the wait before a row's next try after its attempts-th
// failed one: a random time in [1ms, min(RetryMax, RetryBase·2^(attempts-1))].
func (s *session) retryWait(attempts int) time.Duration {
	ceil := s.cfg.RetryBase << min(attempts-1, 30)
	if ceil <= 0 || ceil > s.cfg.RetryMax {
		ceil = s.cfg.RetryMax
	}
	return max(time.Duration(s.rand.Int64N(int64(ceil)+1)), time.Millisecond)
}

// settle removes (or marks published) the acked rows and records the
// failures, in one implicit transaction.
func (s *session) settle(ctx context.Context, conn *pgx.Conn, acked []int64, failed []failure) error {
	b := &pgx.Batch{}
	if len(acked) > 0 {
		if s.cfg.KeepPublished > 0 {
			b.Queue("UPDATE "+s.t.quoted+" SET state = 'published', published_at = now(), retry_at = NULL WHERE id = ANY($1) AND state = 'pending'", acked)
		} else {
			b.Queue("DELETE FROM "+s.t.quoted+" WHERE id = ANY($1) AND state = 'pending'", acked)
		}
	}
	for _, f := range failed {
		b.Queue(`UPDATE `+s.t.quoted+` SET attempts = attempts + 1, last_error = $2,
			rejections = rejections + CASE WHEN $5 THEN 1 ELSE 0 END,
			retry_at = now() + make_interval(secs => $3),
			state = CASE WHEN $4 THEN 'failed' ELSE 'pending' END
			WHERE id = $1 AND state = 'pending'`, f.id, f.err, f.wait.Seconds(), f.final, f.rejected)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: record published rows: %w", err)
	}
	return nil
}

// statsSQL counts the pending and failed rows of the table %[1]s and gives
// the seconds since the oldest pending row could first be published: its
// insert, or its NotBefore when later. Rows whose NotBefore has not come
// are left out, and so are the rows an earlier waiting row of their key
// holds back (hk.first is the key's first waiting row): such a row waits by
// design; once its holder is due the holder counts itself, and a held row
// has never waited longer than its holder. One pass over the table, joined
// to the keys of the waiting rows (read from the retry index, usually few).
const statsSQL = `SELECT count(*) FILTER (WHERE o.state = 'pending'), count(*) FILTER (WHERE o.state = 'failed'),
  coalesce(extract(epoch FROM now() - min(greatest(o.created_at, o.not_before))
    FILTER (WHERE o.state = 'pending' AND (o.not_before IS NULL OR o.not_before <= now())
            AND (hk.first IS NULL OR hk.first >= o.id))), 0)::float8
FROM %[1]s o LEFT JOIN (
  SELECT key, min(id) AS first FROM %[1]s
  WHERE state = 'pending' AND retry_at IS NOT NULL AND key IS NOT NULL GROUP BY key) hk ON hk.key = o.key
WHERE o.state <> 'published'`

// statsSQL is statsSQL for table t.
func (t table) statsSQL() string { return fmt.Sprintf(statsSQL, t.quoted) }

// stats refreshes the pending, oldest-pending and failed gauges.
func (s *session) stats(ctx context.Context, conn *pgx.Conn) error {
	var pending, failed int64
	var oldest float64
	err := s.query(ctx, conn, s.t.statsSQL()).Scan(&pending, &failed, &oldest)
	if err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	s.m.Pending.WithLabelValues(s.t.name).Set(float64(pending))
	s.m.Failed.WithLabelValues(s.t.name).Set(float64(failed))
	s.m.OldestPending.WithLabelValues(s.t.name).Set(max(0, oldest))
	return nil
}

// sweep deletes published rows older than KeepPublished, 1,000 at a time.
func (s *session) sweep(ctx context.Context, conn *pgx.Conn) error {
	for {
		tag, err := s.exec(ctx, conn, `DELETE FROM `+s.t.quoted+` WHERE id IN (
			SELECT id FROM `+s.t.quoted+` WHERE state = 'published' AND published_at < now() - make_interval(secs => $1) LIMIT 1000)`,
			s.cfg.KeepPublished.Seconds())
		if err != nil {
			return fmt.Errorf("outbox: sweep published rows: %w", err)
		}
		if tag.RowsAffected() < 1000 || ctx.Err() != nil {
			return nil
		}
	}
}

func (s *session) query(ctx context.Context, conn *pgx.Conn, sql string, args ...any) pgx.Row {
	return pglead.QueryRow(ctx, conn, s.cfg.QueryTimeout, sql, args...)
}

func (s *session) exec(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (interface{ RowsAffected() int64 }, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return conn.Exec(qctx, sql, args...)
}

// Reason label values of idem_outbox_publish_failures_total. Only the
// rejections of a record itself count towards Relay.MaxAttempts (see
// rejected): too_large, and the invalid records counted under other.
// unknown_topic, authorization and the rest of other (broker outages,
// timeouts, SASL) are outages, retried for as long as they last.
const (
	reasonUnknownTopic  = "unknown_topic"
	reasonTooLarge      = "too_large"
	reasonAuthorization = "authorization"
	reasonOther         = "other"
)

// failureReason classifies a publish error into the bounded reason label of
// idem_outbox_publish_failures_total: reasonUnknownTopic,
// reasonTooLarge, reasonAuthorization or reasonOther. Only errors rejected
// reports count towards Relay.MaxAttempts; the others are outages.
func failureReason(err error) string {
	switch {
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition), errors.Is(err, sarama.ErrInvalidTopic):
		return reasonUnknownTopic
	case tooLarge(err):
		return reasonTooLarge
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed), errors.Is(err, sarama.ErrClusterAuthorizationFailed),
		errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed), errors.Is(err, sarama.ErrSASLAuthenticationFailed):
		return reasonAuthorization
	}
	return reasonOther
}

// rejected reports whether err is Kafka (or the producer) refusing the
// record itself, so that publishing it again will fail the same way however
// long one waits: a record too large for the producer or the topic, a record
// the broker finds invalid (a keyless record on a compacted topic) or whose
// timestamp it refuses. Only these count towards Relay.MaxAttempts. Every
// other error is an outage of the cluster or the topic, retried without
// counting: brokers unreachable, timeouts, SASL authentication, cluster,
// topic or transactional-id authorization (credentials being rotated, ACLs
// being granted), an unknown topic (not created yet).
func rejected(err error) bool {
	return tooLarge(err) || errors.Is(err, sarama.ErrInvalidRecord) || errors.Is(err, sarama.ErrInvalidTimestamp)
}

func tooLarge(err error) bool {
	var ce sarama.ConfigurationError
	return errors.Is(err, sarama.ErrMessageSizeTooLarge) || errors.Is(err, sarama.ErrMessageSetSizeTooLarge) ||
		errors.As(err, &ce) && strings.Contains(string(ce), "MaxMessageBytes")
}

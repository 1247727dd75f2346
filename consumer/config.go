package consumer

import (
	"context"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/schedule"
)

// Config configures Run. The zero value of every optional field means its
// documented default; Brokers, Group, Topics and Dedupe are required.
type Config struct {
	// Brokers are the bootstrap addresses, "host:port".
	Brokers []string

	// Group is the consumer group id. It also names the inbox rows
	// (idem_processed.consumer_group), so two groups reading one topic each get
	// their own effects.
	// Kafka: group.id.
	Group string

	// Topics to consume.
	Topics []string

	// KeyFunc derives the idempotency key of each message (see KeyFunc for
	// the built-in extractors). Set it explicitly when your producers do not
	// write an "idempotency-key" header: a message without a key follows
	// MissingKey, which by default dead-letters it.
	// Default: HeaderKey("idempotency-key").
	KeyFunc KeyFunc

	// MaxKeyLength bounds the idempotency key's length in bytes; longer keys
	// are treated as missing.
	// Default: 256.
	MaxKeyLength int

	// MissingKey says what happens to a message without a valid key.
	// Default: MissingKeyDeadLetter.
	MissingKey MissingKeyPolicy

	// Dedupe records which keys have had their effects. Required:
	// dedupe.NewPostgres(pool) for effects in PostgreSQL (the handler's writes
	// commit with the inbox row), dedupe.NewPostgresLease for effects
	// elsewhere, dedupe.NewMemory for tests and demos.
	Dedupe dedupe.Store

	// Sarama is the base sarama config, for TLS (Net.TLS), SASL (Net.SASL),
	// client id and tuning. idem copies it and then sets what its guarantees
	// depend on: manual offset marking with auto-commit of marked offsets
	// only, Consumer.Offsets.Initial from StartAt (the value you set there is
	// not used; Run logs a WARN when it contradicts StartAt), the isolation
	// level from ReadUncommitted, the cooperative-sticky assignor (unless you
	// set strategies yourself), Consumer.Group.InstanceId from InstanceID,
	// an idempotent acks=all producer for forwards (transactional, on a
	// client of its own, with Transactions), and Version when left at
	// sarama's default (2.8): 4.0 (sarama.V4_0_0_0), the oldest version a
	// Kafka 4 broker accepts (KIP-896), whose requests a Kafka 3.x cluster
	// may refuse, so for one set Version to the brokers' (e.g.
	// sarama.V3_7_0_0).
	// Default: sarama.NewConfig().
	Sarama *sarama.Config

	// Logger receives idem's logs.
	// Default: slog.Default().
	Logger *slog.Logger

	// Registerer receives idem's Prometheus collectors (package metrics).
	// Default: nil (or a nil pointer), metrics are kept but not exported.
	Registerer prometheus.Registerer

	// ShutdownGrace bounds how long an in-flight message may run after its
	// partition is revoked or Run's ctx is cancelled; then the handler's ctx is
	// cancelled, its transaction rolled back and the message left for
	// redelivery. It must be shorter than
	// Sarama.Consumer.Group.Rebalance.Timeout.
	// Default: 10s.
	ShutdownGrace time.Duration

	// CommitInterval is how often marked offsets are committed (with
	// Transactions: how often the member's Kafka transaction commits, with
	// its forwards). Offsets are also committed when a partition is revoked
	// and at shutdown.
	// Default: 1s. Kafka: auto.commit.interval.ms (of marked offsets only).
	CommitInterval time.Duration

	// InstanceID turns on static membership (KIP-345): a stable id of this
	// member, e.g. its pod or host name, unique within the group. A member
	// killed and restarted with the same InstanceID within the session
	// timeout (Sarama.Consumer.Group.Session.Timeout) gets its partitions
	// back without a rebalance: the other members keep theirs and never
	// stop. The trade-off: when a static member dies for good, its
	// partitions wait, unread, up to the session timeout before they move,
	// since it no longer leaves the group on shutdown or crash. Two running
	// members with one InstanceID fence each other (the older one fails
	// with FENCED_INSTANCE_ID). At most 249 characters of [a-zA-Z0-9._-],
	// not "." or "..".
	// Default: "" (dynamic membership: every start and stop rebalances).
	// Kafka: group.instance.id.
	InstanceID string

	// Transactions makes what the member writes to Kafka (forwards and
	// offsets) exactly once for read_committed readers, in Kafka
	// transactions: see TransactionsConfig.
	// Default: TransactionsConfig{} (off; Timeout 10s when on).
	Transactions TransactionsConfig

	// Retry says how a message whose handler failed is tried again: in
	// process (Attempts, Backoff), through retry tiers (Tiers), whether a
	// panic counts as a retriable failure (Panics), and per error (Rules).
	// See RetryConfig.
	// Default: RetryConfig{Attempts: 4, Backoff: {Base: 100ms, Max: 5s}}.
	Retry RetryConfig

	// Limits bound what the handler asks of its dependencies: the flow
	// limits of a breaker.Set split across the group (Breakers), and lanes
	// that adapt to the dependencies' latency (Adaptive). See LimitsConfig.
	// Default: LimitsConfig{} (no limits split; a fixed Concurrency).
	Limits LimitsConfig

	// OnDeadLettered runs after a message was sent to a dead-letter topic
	// (any kind, any rule), in a transaction of the dedupe store that
	// records it in the inbox, so it runs exactly once per message (by where
	// it was first consumed), across redeliveries and crashes: a service
	// marks its payment needs_attention or enqueues a compensating event
	// through the outbox with dedupe.Tx(ctx). That inbox row is keyed by the
	// message's origin ("idem:dead-lettered:<topic>/<partition>/<offset>"),
	// apart from the message's own idempotency key, so a replay of the
	// dead-lettered record is still handled, and a record whose key could
	// not be derived reaches the hook with an empty IdempotencyKey and its
	// origin (DeadLettered.Message.Origin()). An error is retried with
	// backoff, the partition (with Concurrency > 1: the lane) waiting, as
	// for a failed forward. With Transactions it runs only once the Kafka
	// transaction carrying the dead-letter record has committed, so never
	// for a record a read_committed reader does not see; it needs a
	// database then (a dedupe.NewPostgres store, or Ordering ByKey's pool),
	// where the hooks a transaction owes wait for its commit (table
	// idem_txn_hooks), so a member that dies between the commit and the
	// hook leaves it to the partition's next owner.
	// Default: nil.
	OnDeadLettered func(ctx context.Context, d DeadLettered) error

	// Defer enables handler.DeferUntil: a deferred message is stored in
	// PostgreSQL (idem_deferred, created by Migrate), its offset commits at
	// once, and this scheduler, run inside Run (one leader per group across
	// members), publishes it to "<topic>.<group>.deferred" when due, where
	// this group reads it as the same message. Run creates that topic like a
	// retry tier (the source's partitions and record size). Pool is
	// required; Brokers, Sarama, Group, Logger and Registerer are taken from
	// this Config when unset (Group must be this Config's). A deferral is
	// recorded in the inbox (a key of its own, by the record that deferred
	// the message), in the row's transaction when the Dedupe store works on
	// this Pool: a redelivery of that record before its offset committed
	// is not deferred again, and keeps its outcome also past its deadline.
	// Default: nil (a handler that defers gets its message dead-lettered:
	// permanent, "needs Config.Defer").
	Defer *schedule.Scheduler

	// Expiry is when a message is too old to handle: a maximum age per
	// topic and the per-message "idem-deadline" header, and what runs for
	// an expired message (see Expiry).
	// Default: Expiry{Header: "idem-deadline"} (no maximum age; the deadline header is honoured).
	Expiry Expiry

	// Ordering keeps per-key order across retry tiers when set to
	// ByKey(pool), pool holding the parked keys and messages (usually the
	// dedupe store's; its tables are created at start). See ByKey.
	// Default: Ordering{} (none: later messages of a key overtake one in a retry tier).
	Ordering Ordering

	// DLQDepthInterval is how often idem_dlq_depth is refreshed for each
	// source topic's dead-letter topic (its end offsets minus the offsets
	// committed by its admin group "<dlq>.admin", which `idem dlq replay` and
	// `idem dlq purge` advance). A negative value disables it.
	// Default: 30s.
	DLQDepthInterval time.Duration

	// LagInterval is how often idem_consumer_lag is refreshed for every
	// claimed partition, source and retry tier: the high watermark minus the
	// group's committed offset, asked of the cluster; and with it
	// idem_consumer_lag_actionable and idem_consumer_lag_seconds, the
	// records a member could start now (retry-tier and deferred records
	// once due) and how long the oldest has waited (a few small reads of
	// each tier partition and one query of idem_deferred, off the message
	// path). A negative value disables them.
	// Default: 15s.
	LagInterval time.Duration

	// OutageBackoff bounds the wait between tries while the dedupe store or
	// the broker is unavailable. Such tries are not handler attempts, so it
	// is not part of Retry: an outage never spends a message's attempts.
	// Default: 5s (starting at 100ms, doubling, with jitter).
	OutageBackoff time.Duration

	// StallWarning is how long a partition may fail on one message (database
	// outages, in-process retries, forwards that do not go through) before
	// idem logs a WARN with the cause, repeated every minute while it lasts.
	// idem_partition_stalled_seconds shows every partition's stall at all
	// times.
	// Default: 1m.
	StallWarning time.Duration

	// ReadUncommitted makes the consumer read records of aborted and still
	// open Kafka transactions. Leave it false unless you know every producer
	// of the topics is non-transactional: records a transactional producer
	// aborted were never meant to happen.
	// Default: false (read_committed). Kafka: isolation.level.
	ReadUncommitted bool

	// StartAt says where a group with no committed offset for a partition
	// starts reading: the oldest retained record or the next new one. Kafka
	// also applies it when a group's committed offsets have expired
	// (offsets.retention.minutes, 7 days by default): with StartOldest the
	// group then re-reads the whole topic, and records older than the inbox
	// retention (Retention.Keep) are applied twice.
	// Default: StartOldest. Kafka: auto.offset.reset.
	StartAt StartPosition

	// Batch groups the new messages of a partition (of a lane, with
	// Concurrency > 1) into one transaction: one multi-row inbox INSERT finds
	// the new keys in one round trip, the handler runs for each new message
	// (or a handler.Batch handler once for all of them) in that transaction, and
	// one COMMIT records them. A batch takes the messages already fetched, up
	// to Batch.MaxMessages, waiting at most Batch.MaxWait for more, so it adds
	// no latency when the partition is idle. If the handler fails, the batch
	// is rolled back whole (no savepoints) and its messages run again one per
	// transaction, so only the failing message takes the retry path. Records
	// from retry tiers, records without a valid key, Ordering ByKey, and
	// dedupe stores that do not implement dedupe.BatchStore are handled one
	// per transaction.
	// Default: BatchConfig{MaxLatency: 50ms} (off: one message per transaction; with a handler.Batch handler, MaxMessages 500).
	Batch BatchConfig

	// Concurrency is the number of lanes per partition: messages are spread
	// over them by a hash of LaneBy, so messages of one key keep their order
	// while other keys run in parallel. An offset is committed only when
	// every message below it is final (the lowest unfinished offset), so a
	// crash redelivers whatever was in flight; the inbox makes that safe. A
	// revoked partition waits for its lanes' in-flight messages within
	// ShutdownGrace. Each lane holds its own database connection while it
	// works: budget members × partitions (retry tiers included) ×
	// Concurrency connections; Run warns when a member's pool is smaller
	// than its share (docs/performance.md). With
	// Transactions a forward to a retry tier or the dead-letter topic waits
	// until every earlier message of its partition is final (see
	// Transactions).
	// Default: 1 (one message at a time per partition).
	Concurrency int

	// LaneBy chooses what keeps its order across lanes (Concurrency > 1).
	// With Ordering ByKey the Kafka key is always used.
	// Default: LaneByIdempotencyKey.
	LaneBy LaneKey

	// Retention is how long the inbox keeps a key, and whether Run deletes
	// older keys itself (see RetentionConfig). It is the inbox's retention;
	// the retry-tier and dead-letter topics' is Retry.Tiers.Retention.
	// Default: RetentionConfig{} (Run sweeps a PostgreSQL inbox, keeping keys 14 days).
	Retention RetentionConfig

	// Readiness, when set, is kept up to date by Run for a /readyz endpoint:
	// see (*Readiness).Check and metrics.NewServeMux.
	// Default: nil (no readiness reported).
	Readiness *Readiness

	// OnAssigned is called when partitions are claimed, before any of their
	// messages is handled: once per rebalance with every partition it added
	// to this member (source and retry-tier topics), sorted by topic and
	// partition. It runs on one of the claims' goroutines; those claims wait
	// until it returns, so it must return promptly (within
	// Sarama.Consumer.Group.Rebalance.Timeout). Its ctx carries the values of
	// Run's ctx and is never cancelled.
	// Default: nil.
	OnAssigned func(ctx context.Context, tps []TopicPartition)

	// OnRevoked is called when a claimed partition ends (revoked by a
	// rebalance, or released at shutdown), once per partition with a slice
	// of one: after its in-flight messages finished or were abandoned past
	// ShutdownGrace and after a synchronous commit of the marked offsets,
	// before the partition can be consumed by another member. Calls for
	// different partitions may run concurrently. It must return promptly
	// (within Sarama.Consumer.Group.Rebalance.Timeout). Its ctx carries the
	// values of Run's ctx and is never cancelled.
	// Default: nil.
	OnRevoked func(ctx context.Context, tps []TopicPartition)

	// TracerProvider makes the OpenTelemetry tracer of the spans idem starts:
	// one "idem.handle" span per message attempt, a child of the context in
	// the record's traceparent/tracestate headers (the package doc's Tracing
	// section lists the spans and their attributes).
	// Default: otel.GetTracerProvider() (a no-op until the program installs
	// an SDK provider with otel.SetTracerProvider).
	TracerProvider trace.TracerProvider

	// Propagator reads the trace context from consumed records' headers and
	// writes it into forwarded records (retry tiers, dead-letter topic).
	// The default is W3C trace context, not otel.GetTextMapPropagator():
	// the global propagator is a no-op unless the program sets one, and
	// traces would silently break at idem.
	// Default: propagation.TraceContext{}.
	Propagator propagation.TextMapPropagator

	// FailureIndex, when set, runs this failure indexer (index.Indexer.Run)
	// inside Run's process for as long as Run runs: it stores every record of
	// this consumer's dead-letter topics in the PostgreSQL failure index that
	// idem console and `idem dlq --database-url` read. Run copies it and
	// fills its empty Brokers, Sarama, Logger and Registerer from this
	// Config; empty Topics (with no TopicPattern) become the dead-letter
	// topic of each of Config.Topics (Retry.Tiers.DLQ). Pool is required. The
	// indexer retries its own start (migration, Kafka) with backoff, so a
	// database or broker briefly down at start delays indexing only.
	// Default: nil (no indexer: run idem console or index.Indexer apart).
	FailureIndex *index.Indexer

	// Routes run several handlers in one Run: each message goes to the
	// first route that takes its topic and type (Route.Topics, Route.Types),
	// handled with that route's KeyFunc, Retry, Expiry and Batch; the
	// handler given to Run, if any, takes the rest with this Config's. See
	// Route and docs/routes.md.
	// Default: nil (one handler: the one given to Run).
	Routes []Route

	// TypeHeader is the header that names a message's type, for the
	// routes that take some types only (Route.Types): "ce_type" is
	// CloudEvents' (its Kafka binding). It is read, without a copy, only
	// for a topic some of whose routes list types. A message without it
	// has no type: it goes to the route of its topic that takes every
	// type, else to the handler given to Run, else to Unmatched. Set
	// TypeHeader or TypeOf, not both.
	// Default: "" (see TypeOf).
	TypeHeader string

	// TypeOf names a message's type when a header does not (TypeHeader):
	// a serde.Registry's RecordName or Subject method names the schema of
	// a value in a schema registry's wire format. It runs only for a topic
	// some of whose routes list types, once per message (again in the
	// lanes' dispatcher with Concurrency > 1). An error marked
	// handler.Decode (a value not in the wire format, an unknown schema
	// id) dead-letters the message at once, kind decode, with Retry's
	// policy; one for which breaker.IsOpen holds (the registry is down) is
	// waited out like any outage, spending no attempt; any other error,
	// like a type no route lists, leaves the message to the route of its
	// topic that takes every type, else to the handler given to Run, else
	// to Unmatched.
	// Default: nil (routes take messages by topic, or by TypeHeader).
	TypeOf KeyFunc

	// Unmatched says what happens to a message no route takes when Run is
	// given no handler (nil: Routes only): dead-lettered with Retry's
	// dead-letter topic, kind permanent, or skipped; either way counted in
	// idem_unmatched_total.
	// Default: UnmatchedDeadLetter.
	Unmatched UnmatchedPolicy

	// Filter, when set, runs first for every message read (from a source
	// topic, a retry tier or the deferred topic): a non-empty reason skips
	// the message before the inbox (no key, no row, no transaction, no
	// handler), its offset commits, and it is counted in
	// idem_filtered_total by reason (keep the reasons few: each is a
	// series). A Filter is called from several goroutines at once, must be
	// fast (no I/O) and must not keep the message; a panic in it keeps the
	// message (logged at ERROR).
	// Default: nil (no message is filtered out).
	Filter func(m *handler.Message) (skip string)

	// Controls, when set, makes this member obey its group's live controls,
	// kept in this database (tables idem_control_*, which Run creates, as
	// idem.Migrate does), and report to the fleet: an operator may pause a
	// topic or a partition (idem pause, the console), which stops its
	// handling until resumed (its retry tiers and deferred topic too, for
	// this group), and re-drive a window of a topic (idem redrive), which
	// the member owning each partition reads again under a replay epoch
	// that the inbox keys records by (dedupe.Record.Epoch), so each key of
	// the window runs once more. Run LISTENs on one connection of its own
	// taken from the pool (and re-reads the controls every 30 s), and writes
	// a heartbeat row every 10 s: partitions, lag, pause reasons, the open
	// breaker. Until it has read the controls once, no message is handled,
	// so a pause holds across restarts and rebalances. Usually the dedupe
	// store's pool. See docs/console.md, "Live controls".
	// Default: nil (off: pauses and re-drives are not obeyed, and the
	// member is not in the fleet).
	Controls *pgxpool.Pool

	// EncryptionKeyFile names a file holding the key-encryption key (KEK)
	// of payload encryption at rest (`idem keys generate` writes one; mode
	// 600): with it, the payloads the consumer keeps in PostgreSQL are
	// sealed with AES-256-GCM under data keys the KEK wraps (package
	// docs/console.md, "Encryption at rest"): the value and headers of
	// messages parked behind their key's head (Ordering: ByKey) and of
	// deferred messages (Defer, whose scheduler gets the same key when its
	// own is unset). Their topic, partition, Kafka key, idempotency key and
	// origin stay in clear. A parked or deferred message whose data key was
	// destroyed (`idem keys destroy`) is never handled or published: it is
	// dead-lettered as a stub (no value, none of its headers, kind
	// permanent, the reason as idem-error). Run refuses a file others may
	// read, and a KEK that does not unwrap the data keys already written.
	// Rows written before stay in clear and read as ever. The failure index
	// (FailureIndex) has a key of its own.
	// Default: "" (payloads stored in clear).
	EncryptionKeyFile string
	// EncryptionKey is EncryptionKeyFile's content given directly, e.g.
	// from an environment variable. Give one of the two.
	// Default: "".
	EncryptionKey string
}

// Defaults of Config, in one place. TestDocumentedDefaults checks each field's
// "Default:" line against it.
func defaults() Config {
	return Config{
		KeyFunc:          HeaderKey("idempotency-key"),
		MaxKeyLength:     256,
		MissingKey:       MissingKeyDeadLetter,
		Batch:            BatchConfig{MaxLatency: 50 * time.Millisecond},
		Sarama:           sarama.NewConfig(),
		Logger:           slog.Default(),
		ShutdownGrace:    10 * time.Second,
		CommitInterval:   time.Second,
		Transactions:     TransactionsConfig{Timeout: 10 * time.Second},
		Expiry:           Expiry{Header: expiry.HeaderDeadline},
		OutageBackoff:    5 * time.Second,
		Retry:            RetryConfig{Attempts: 4, Backoff: recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}},
		DLQDepthInterval: 30 * time.Second,
		LagInterval:      15 * time.Second,
		StallWarning:     time.Minute,
		StartAt:          StartOldest,
		Concurrency:      1,
		LaneBy:           LaneByIdempotencyKey,
		TracerProvider:   otel.GetTracerProvider(),
		Propagator:       propagation.TraceContext{},
	}
}

// withDefaults returns c with every zero optional field set to its default.
func (c Config) withDefaults() Config {
	d := defaults()
	if coremetrics.IsNil(c.Registerer) { // a nil *prometheus.Registry: no metrics, as nil
		c.Registerer = nil
	}
	if c.KeyFunc == nil {
		c.KeyFunc = d.KeyFunc
	}
	if c.MaxKeyLength == 0 {
		c.MaxKeyLength = d.MaxKeyLength
	}
	if c.Sarama == nil {
		c.Sarama = d.Sarama
	}
	if c.Logger == nil {
		c.Logger = d.Logger
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = d.ShutdownGrace
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = d.CommitInterval
	}
	if c.OutageBackoff == 0 {
		c.OutageBackoff = d.OutageBackoff
	}
	if c.Transactions.Timeout == 0 {
		c.Transactions.Timeout = d.Transactions.Timeout
	}
	if c.Expiry.Header == "" {
		c.Expiry.Header = d.Expiry.Header
	}
	if c.Limits.Adaptive != nil {
		a := c.Limits.Adaptive.withDefaults() // a copy: the caller's stays as set
		c.Limits.Adaptive = &a
	}
	if c.DLQDepthInterval == 0 {
		c.DLQDepthInterval = d.DLQDepthInterval
	}
	if c.LagInterval == 0 {
		c.LagInterval = d.LagInterval
	}
	if c.Retry.Attempts == 0 {
		c.Retry.Attempts = d.Retry.Attempts
	}
	if c.Retry.Backoff.Base == 0 {
		c.Retry.Backoff.Base = d.Retry.Backoff.Base
	}
	if c.Retry.Backoff.Max == 0 {
		c.Retry.Backoff.Max = d.Retry.Backoff.Max
	}
	if c.StallWarning == 0 {
		c.StallWarning = d.StallWarning
	}
	if c.Concurrency == 0 {
		c.Concurrency = d.Concurrency
	}
	if c.Batch.MaxLatency == 0 {
		c.Batch.MaxLatency = d.Batch.MaxLatency
	}
	if c.TracerProvider == nil {
		c.TracerProvider = d.TracerProvider
	}
	if c.Propagator == nil {
		c.Propagator = d.Propagator
	}
	return c
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/expiry"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/schedule"
)

// MissingKeyPolicy says what happens to a message without a valid idempotency
// key (no key, an empty one, one longer than MaxKeyLength, or a KeyFunc error).
type MissingKeyPolicy int

const (
	// MissingKeyDeadLetter sends the message to the dead-letter topic with
	// idem-error-kind "missing-key". The default: without a key, idem cannot
	// make a retry safe, so it refuses to guess.
	MissingKeyDeadLetter MissingKeyPolicy = iota
	// MissingKeyUseCoordinates uses "<topic>/<partition>/<offset>" of the
	// original record as the key. Redelivery of the same record is then
	// deduplicated, but a producer that sends the same event twice gets two
	// effects: only for streams where the producer never retries.
	MissingKeyUseCoordinates
)

// String returns "dead-letter" or "use-coordinates".
func (p MissingKeyPolicy) String() string {
	switch p {
	case MissingKeyDeadLetter:
		return "dead-letter"
	case MissingKeyUseCoordinates:
		return "use-coordinates"
	}
	return fmt.Sprintf("MissingKeyPolicy(%d)", int(p))
}

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
	// Default: nil, metrics are kept but not exported.
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

// BatchConfig sizes the batches of Config.Batch.
type BatchConfig struct {
	// MaxMessages is the most messages in one transaction; 1 turns
	// batching off. Left 0, it is 0 (off) for a handler that handles one
	// message at a time, and 500 for a batch handler (handler.Batch), which
	// Run recognises: a batch handler batches unless told otherwise.
	// Default: 0 (off; 500 with a handler.Batch handler).
	MaxMessages int
	// MaxWait is how long a batch that is not full waits for more messages
	// once it has one.
	// Default: 0 (take what has been fetched; never wait).
	MaxWait time.Duration
	// MaxLatency is the latency budget of a batch: a batch closes when its
	// age (since its first message was taken) reaches MaxLatency, even if
	// MaxWait has not run out and it is not full; and a batch takes no more
	// messages than its handler is expected to get through within
	// MaxLatency, from the handler time per message of the worker's recent
	// batches (at least one message, at most MaxMessages). So a slow handler
	// gets smaller batches and each message waits for its commit about
	// MaxLatency at most, while a fast one keeps MaxMessages. Negative: no
	// budget (batches close only at MaxMessages or MaxWait).
	// Default: 50ms.
	MaxLatency time.Duration
}

// RetryConfig is Config.Retry: how a message whose handler returned a
// retriable error is tried again. Permanent errors, decode errors, missing
// keys and (unless Panics) panics go to the dead-letter topic at once.
type RetryConfig struct {
	// Attempts is how many times the handler is called for one delivery of
	// a message that keeps failing with a retriable error, each call in a
	// fresh transaction: at the source topic, and again in each retry tier.
	// After them the message is forwarded to the next tier of Tiers, or after
	// the last tier to the dead-letter topic, so an always failing message is
	// handled Attempts × (1 + len(Tiers.Delays)) times in all (package doc,
	// "Attempts per message"). 1 means no in-process retries; a negative value is an error.
	// Default: 4 (three in-process retries).
	Attempts int

	// Backoff shapes the waits between in-process attempts: retry n waits a
	// uniformly random time in [0, min(Max, Base*2^(n-1))] ("full jitter"),
	// or at least the delay asked by handler.RetryAfter (one longer than Max
	// sends the message to its retry tier instead, when there are tiers).
	// A zero Base or Max takes its default.
	// Default: {Base: 100ms, Max: 5s}.
	Backoff recovery.Backoff

	// Panics treats a handler panic like a retriable error instead of
	// dead-lettering it at once.
	// Default: false.
	Panics bool

	// Tiers says where a message goes when its in-process attempts are
	// spent: through non-blocking retry topics, one per entry of
	// Tiers.Delays, then to the dead-letter topic (Tiers.DLQ). idem creates
	// missing tier and dead-letter topics at start (with at least the
	// source's partitions) and subscribes to the tiers itself.
	// Tiers.Retention is those topics' retention.ms.
	// Default: retrytopic.Policy{} (no tiers; dead-letter topic "<topic>.<group>.dlq").
	Tiers retrytopic.Policy

	// Rules choose, by the error, how a failed message is retried: each
	// rule's Match (errors.Is/As, kind, SQLSTATE class, HTTP status) picks
	// its attempts per delivery, backoff, retry-tier ladder and dead-letter
	// topic (e.g. fraud declines to "payments.dlq.fraud"). Rules are
	// matched in order against the error the handler returned; the first
	// match wins, and an error no rule matches takes the fallback rule the
	// other fields make (Attempts, Backoff, Tiers). A rule's zero fields
	// take the fallback's. A rule never makes a permanent error retriable:
	// it only chooses its dead-letter topic. Validated at start (a rule
	// without a Match is an error). See package recovery.
	// Default: nil (every error takes the fallback rule).
	Rules []recovery.Rule
}

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

// LimitsConfig is Config.Limits: how the handler's calls to its
// dependencies are bounded.
type LimitsConfig struct {
	// Breakers is the breaker.Set the handler calls its dependencies
	// through, when it has flow limits (Set.SetLimits: a rate and calls in
	// flight per dependency, the budget of the whole group). Run registers
	// its series (breaker.NewLimitCollector: idem_dependency_*) on
	// Registerer and, after each rebalance and every 5 s, splits the budget
	// across the group's members: Set.SetShare(1/members). Until a member
	// has counted the group it uses the whole budget; during a rebalance
	// members may briefly use more than their share.
	// Default: nil (no limits split; the handler may still use a Set).
	Breakers *breaker.Set

	// Adaptive makes the handler calls in flight adapt to the latency and
	// the 429s of the dependencies (see Adaptive): each partition gets
	// Adaptive.Max lanes (Config.Concurrency is then ignored) and a
	// member-wide AIMD limit, exported as idem_lanes, decides how many run
	// at once.
	// Default: nil (a fixed Config.Concurrency).
	Adaptive *Adaptive
}

// RetentionConfig is Config.Retention: how long the inbox keeps a key and
// who deletes the older ones. A message delivered again after its key was
// deleted runs its handler again, so the inbox must remember a key for as
// long as a copy of its message may arrive.
//
// When Dedupe is a PostgreSQL store (dedupe.NewPostgres,
// dedupe.NewPostgresLease: any store with a Sweeper method) and NoSweep is false, Run
// starts a dedupe.Sweeper on its table that deletes, every minute, the rows
// processed more than Keep ago; it stops with Run. The sweeper deletes old
// rows of every consumer group in the table, so services sharing one inbox
// table must agree on Keep (or use dedupe.WithTable). Validate then requires
// Keep to be at least 1h (the sweeper's minimum) and the retention of the
// retry-tier and dead-letter topics (Retry.Tiers.Retention, 7 days by
// default): a failed record can wait that long in a tier, or in the
// dead-letter topic until an operator replays it, and a second copy of an
// already handled message (forwarded twice after a crash, or sent twice by
// its producer) must still find its key.
//
// Either way, Run compares Keep at start with each source topic's
// retention.ms and warns, naming both numbers, when the inbox forgets
// sooner than Kafka keeps records: a record re-read after its key was
// deleted (expired group offsets, an offset reset) would be applied twice.
type RetentionConfig struct {
	// Keep is how long the inbox keeps a key. With NoSweep, or a store Run
	// does not sweep (dedupe.NewMemory, a custom store), it only tells Run
	// how long the store keeps keys, for the check against retention.ms;
	// left 0 there, it is unknown and nothing is checked. Negative is an
	// error.
	// Default: 0 (14 days, the sweeper's default, when Run sweeps; unknown when it does not).
	Keep time.Duration

	// NoSweep stops Run from sweeping the inbox: you sweep it yourself (a
	// dedupe.Sweeper or a cron job of your own), and the table grows until
	// you do.
	// Default: false (Run sweeps a store with a Sweeper method).
	NoSweep bool
}

// LaneKey is what Config.LaneBy hashes to pick a message's lane.
type LaneKey int

const (
	// LaneByIdempotencyKey keeps the order of messages with one idempotency
	// key. The default.
	LaneByIdempotencyKey LaneKey = iota
	// LaneByKafkaKey keeps the order of messages with one Kafka record key.
	LaneByKafkaKey
)

// String returns "idempotency-key" or "kafka-key".
func (l LaneKey) String() string {
	switch l {
	case LaneByIdempotencyKey:
		return "idempotency-key"
	case LaneByKafkaKey:
		return "kafka-key"
	}
	return fmt.Sprintf("LaneKey(%d)", int(l))
}

// StartPosition is where a group without a committed offset starts reading.
type StartPosition int

const (
	// StartOldest reads from the oldest retained record. The default.
	StartOldest StartPosition = iota
	// StartNewest reads only records produced after the group joined.
	StartNewest
)

// String returns "oldest" or "newest".
func (s StartPosition) String() string {
	switch s {
	case StartOldest:
		return "oldest"
	case StartNewest:
		return "newest"
	}
	return fmt.Sprintf("StartPosition(%d)", int(s))
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

// badEach records each error joined in err (errors.Join) as a problem of
// field, so that a group's validator that reports every problem at once
// gives one error per problem.
func badEach(l *configerr.List, field string, err error) {
	if err == nil {
		return
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			badEach(l, field, e)
		}
		return
	}
	l.Check(field, err)
}

// ErrInvalidConfig is matched (errors.Is) by every error Validate returns,
// and by Run's error for a nil handler. Each problem names the field, its
// value and the rule it breaks, e.g. "consumer: invalid config:
// Config.Concurrency = 0: must be between 1 and 1024"; Validate joins them
// all (errors.Join).
var ErrInvalidConfig = errors.New("consumer: invalid config")

// Validate reports every problem of c (with defaults applied) at once, each
// matching ErrInvalidConfig; nil if c can run.
func (c Config) Validate() error {
	c = c.withDefaults()
	errs := configerr.New(ErrInvalidConfig, "Config.")
	if len(c.Brokers) == 0 {
		errs.Bad("Brokers", c.Brokers, "at least one broker address is required")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" || !strings.Contains(b, ":") {
			errs.Bad("Brokers", b, `each broker must be "host:port"`)
		}
	}
	if strings.TrimSpace(c.Group) == "" {
		errs.Bad("Group", c.Group, "a consumer group id is required")
	}
	if len(c.Topics) == 0 {
		errs.Bad("Topics", c.Topics, "at least one topic is required")
	}
	seen := map[string]bool{}
	for _, t := range c.Topics {
		if t == "" {
			errs.Bad("Topics", c.Topics, "topic names must not be empty")
		}
		if seen[t] {
			errs.Bad("Topics", t, "listed twice")
		}
		seen[t] = true
	}
	if c.Dedupe == nil {
		errs.Bad("Dedupe", nil, "a dedupe store is required (dedupe.NewPostgres(pool), or dedupe.NewMemory() for tests)")
	}
	if c.MaxKeyLength < 0 {
		errs.Bad("MaxKeyLength", c.MaxKeyLength, "must be > 0")
	}
	if c.MissingKey != MissingKeyDeadLetter && c.MissingKey != MissingKeyUseCoordinates {
		errs.Bad("MissingKey", c.MissingKey, "unknown policy")
	}
	if c.ShutdownGrace < 0 {
		errs.Bad("ShutdownGrace", c.ShutdownGrace, "must be > 0")
	}
	if rt := c.Sarama.Consumer.Group.Rebalance.Timeout; c.ShutdownGrace >= rt {
		errs.Bad("ShutdownGrace", c.ShutdownGrace, fmt.Sprintf("must be shorter than Sarama.Consumer.Group.Rebalance.Timeout (%s)", rt))
	}
	if c.CommitInterval < 0 {
		errs.Bad("CommitInterval", c.CommitInterval, "must be > 0")
	}
	if c.OutageBackoff < 0 {
		errs.Bad("OutageBackoff", c.OutageBackoff, "must be > 0")
	}
	if c.InstanceID != "" {
		if err := validInstanceID(c.InstanceID); err != nil {
			errs.Bad("InstanceID", c.InstanceID, err.Error())
		}
	}
	c.validateTransactions(errs)
	if c.Retry.Attempts < 1 {
		errs.Bad("Retry.Attempts", c.Retry.Attempts, "must be >= 1 (1: no in-process retries; 0: the default, 4)")
	}
	if err := c.Retry.Tiers.Validate(); err != nil {
		errs.Bad("Retry.Tiers", c.Retry.Tiers.Delays, err.Error())
	}
	for _, t := range c.Topics {
		if t == "" {
			continue
		}
		if err := c.Retry.Tiers.ValidateNames(t, c.Group); err != nil && strings.TrimSpace(c.Group) != "" {
			errs.Bad("Retry.Tiers", t, err.Error())
		}
	}
	if c.Ordering.keyed && c.Ordering.db == nil {
		errs.Bad("Ordering", c.Ordering, "ByKey needs the PostgreSQL pool that holds the parked messages: ByKey(pool), not ByKey(nil)")
	}
	if c.StallWarning < 0 {
		errs.Bad("StallWarning", c.StallWarning, "must be > 0")
	}
	if c.StartAt != StartOldest && c.StartAt != StartNewest {
		errs.Bad("StartAt", c.StartAt, "unknown start position")
	}
	if c.Concurrency < 1 || c.Concurrency > 1024 {
		errs.Bad("Concurrency", c.Concurrency, "must be between 1 and 1024")
	}
	if c.LaneBy != LaneByIdempotencyKey && c.LaneBy != LaneByKafkaKey {
		errs.Bad("LaneBy", c.LaneBy, "unknown lane key")
	}
	if c.Batch.MaxMessages < 0 || c.Batch.MaxMessages > 10000 {
		errs.Bad("Batch.MaxMessages", c.Batch.MaxMessages, "must be between 0 and 10000")
	}
	if c.Batch.MaxWait < 0 {
		errs.Bad("Batch.MaxWait", c.Batch.MaxWait, "must be >= 0")
	}
	validateRetention(c, errs)
	if c.Retry.Backoff.Base < 0 {
		errs.Bad("Retry.Backoff.Base", c.Retry.Backoff.Base, "must be > 0")
	}
	if ix := c.failureIndex(); ix != nil {
		badEach(errs, "FailureIndex", ix.Validate())
	}
	badEach(errs, "Limits.Adaptive", c.Limits.Adaptive.validate())
	badEach(errs, "Defer", c.validateDefer())
	c.validateEncryption(errs)
	badEach(errs, "Expiry", c.Expiry.policy().Validate())
	c.validateRoutes(errs)
	if c.Retry.Backoff.Max < c.Retry.Backoff.Base {
		errs.Bad("Retry.Backoff.Max", c.Retry.Backoff.Max, fmt.Sprintf("must be >= Retry.Backoff.Base (%s)", c.Retry.Backoff.Base))
	} else if len(c.Retry.Rules) > 0 && c.Retry.Tiers.Validate() == nil && c.Retry.Backoff.Base >= 0 && c.Retry.Attempts >= 1 {
		c.validateRules(errs) // only once the fallback's own fields passed: recovery.New checks them again
	}
	return errs.Err()
}

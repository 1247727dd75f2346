package schedule

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/retrytopic"
)

// Defaults of the Scheduler fields, applied when a field is zero.
const (
	defaultBatchSize     = 500
	defaultMaxWait       = 30 * time.Second
	defaultLeaderRetry   = time.Second
	defaultRetryBase     = 100 * time.Millisecond
	defaultRetryMax      = 30 * time.Second
	defaultStatsInterval = 5 * time.Second
	defaultQueryTimeout  = 30 * time.Second
)

// Scheduler publishes one consumer group's deferred records (Defer) to Kafka
// when they come due. It is a plain configuration struct: Run does the work
// and keeps its state on its own stack, so a Scheduler value may be copied
// and Run once at a time.
//
// # Leadership
//
// Run as many schedulers of a group as you like (one per consumer process,
// say); exactly one publishes. Each holds a dedicated connection (taken out
// of Pool for good) on which it tries pg_try_advisory_lock(key of the table and group)
// every LeaderRetry; the holder reads, publishes and deletes on that same
// connection, so a leader whose connection dies cannot delete anything more
// and loses the lock in the same instant. When the leader's process dies,
// PostgreSQL ends its session and releases the lock, and a standby takes over
// within LeaderRetry. This is outbox.Relay's election, per group instead of
// per table.
//
// # Waking up
//
// The leader reads the group's rows whose due_at has come (database clock)
// in due order, BatchSize at a time. When none is left it asks the database
// for the group's next due_at and sleeps until then, or until a NOTIFY (an
// insert into the table committed: a new row may be due sooner), or at most
// MaxWait: it neither polls nor publishes late.
//
// # Guarantee: each deferred message is handled once
//
// A row is deleted only after Kafka acknowledged its record (acks=all,
// idempotent producer), in a statement on the lock's connection. A leader
// killed between the ack and the delete leaves the row, and the next leader
// publishes it again: publication is at least once, never lost. The copies
// are the same record (key, value, headers, so the same idempotency key), and
// the consumer's inbox records a key only when its handler succeeds, so the
// first copy handled has the effects and every later copy is a duplicate:
// handled once. The same holds when a handler defers a copy again (the
// inbox has no row for the key yet, so the newest copy runs the handler).
//
// Deferred records leave their key's order: each is published at its own
// due time, whatever was published for its key meanwhile.
//
// # Failures
//
// A failed publish (brokers down, unknown topic, authorization, a record
// refused) is logged, counted in idem_schedule_publish_failures_total and
// tried again after a backoff with full jitter (RetryBase doubling per
// attempt of that row, up to RetryMax), by moving the row's due_at; the
// row's attempts and last_error show in `idem schedule list`. A row is never
// deleted unpublished. Lost database connections are retried with backoff
// (LeaderRetry doubling, up to RetryMax).
type Scheduler struct {
	// Pool is the database of the idem_deferred table. Required. The
	// scheduler takes one connection out of it for good (its lock and LISTEN
	// connection); session advisory locks and LISTEN need a direct
	// connection or a session-mode pooler.
	Pool *pgxpool.Pool

	// Brokers are the Kafka bootstrap addresses, "host:port". Required.
	Brokers []string

	// Sarama is the base sarama config (TLS, SASL, client id). The scheduler
	// copies it and applies retrytopic.ConfigureProducer (idempotent,
	// acks=all, no topic auto-creation, the partition chosen per record).
	// Default: sarama.NewConfig().
	Sarama *sarama.Config

	// Group is the consumer group whose deferred records this scheduler
	// publishes; one scheduler of a group leads at a time. Required.
	Group string

	// BatchSize is the most due rows one round reads and publishes.
	// Default: 500.
	BatchSize int

	// MaxWait is the longest an idle leader sleeps without looking at the
	// table (a fallback: a timer wakes it at the next due time and a NOTIFY
	// at each insert).
	// Default: 30s.
	MaxWait time.Duration

	// LeaderRetry is how often a standby tries to take the group's lock, and
	// the first wait before reconnecting after a failure (doubling with each
	// failure in a row, with jitter, up to RetryMax).
	// Default: 1s.
	LeaderRetry time.Duration

	// RetryBase and RetryMax shape the wait before a row whose publish failed
	// is tried again: a uniformly random time in [0, min(RetryMax,
	// RetryBase*2^(attempts-1))].
	// Default: 100ms.
	RetryBase time.Duration
	// RetryMax caps the retry wait (see RetryBase).
	// Default: 30s.
	RetryMax time.Duration

	// StatsInterval is how often the leader refreshes idem_schedule_pending.
	// Default: 5s.
	StatsInterval time.Duration

	// QueryTimeout bounds each statement on the scheduler's connection.
	// Default: 30s.
	QueryTimeout time.Duration

	// Logger receives the scheduler's logs.
	// Default: slog.Default().
	Logger *slog.Logger

	// Registerer receives the idem_schedule_* collectors.
	// Default: nil, metrics are kept but not exported.
	Registerer prometheus.Registerer

	// EncryptionKeyFile names a file holding the key-encryption key (KEK)
	// of payload encryption at rest (`idem keys generate` writes one; mode
	// 600): the scheduler opens the deferred messages a consumer sealed
	// with the same key (consumer.Config.EncryptionKeyFile, which Run gives
	// its Config.Defer when this is unset). A sealed row is published in
	// clear, as it was deferred. One whose data key was destroyed (`idem
	// keys destroy`), or that does not authenticate, is never published: a
	// stub of it (no value, none of its headers, kind permanent, the reason
	// as idem-error) goes to the dead-letter topic the consumer recorded
	// with it, the row is deleted, and idem_schedule_dead_lettered_total
	// counts it. A sealed row read without a key waits, as a failed publish
	// (last_error says so). Run refuses a file others may read, and
	// returns an error for a KEK that does not unwrap the deferred
	// messages' data keys.
	// Default: "" (rows written in clear only).
	EncryptionKeyFile string
	// EncryptionKey is EncryptionKeyFile's content given directly, e.g.
	// from an environment variable. Give one of the two.
	// Default: "".
	EncryptionKey string

	// afterAck, when set (tests only), runs after a round's acks and before
	// its rows are deleted.
	afterAck func(ids []int64)
}

// Validate reports every bad field at once (errors.Join), each naming the
// field, its value and the rule, every one matching ErrInvalidConfig. Zero
// fields count as their defaults. Run calls it.
func (s *Scheduler) Validate() error {
	if s == nil {
		return fmt.Errorf("%w: nil Scheduler", ErrInvalidConfig)
	}
	c := s.withDefaults()
	l := configerr.New(ErrInvalidConfig, "Scheduler.")
	if c.Pool == nil {
		l.Bad("Pool", nil, "required")
	}
	if len(c.Brokers) == 0 {
		l.Bad("Brokers", c.Brokers, "at least one host:port required")
	}
	if c.Group == "" {
		l.Bad("Group", c.Group, "required (the consumer group whose deferred records it publishes)")
	}
	if c.BatchSize < 0 {
		l.Bad("BatchSize", c.BatchSize, "must be >= 0 (0: the default)")
	}
	l.NonNegative(map[string]time.Duration{"MaxWait": c.MaxWait, "LeaderRetry": c.LeaderRetry, "RetryBase": c.RetryBase,
		"RetryMax": c.RetryMax, "StatsInterval": c.StatsInterval, "QueryTimeout": c.QueryTimeout})
	if c.EncryptionKeyFile != "" && c.EncryptionKey != "" {
		l.Bad("EncryptionKey", "(set)", "give the key-encryption key in EncryptionKeyFile or EncryptionKey, not both")
	}
	if c.RetryBase > c.RetryMax {
		l.Bad("RetryBase", c.RetryBase, fmt.Sprintf("must not exceed RetryMax (%s)", c.RetryMax))
	}
	l.Check("Sarama", producerConfig(s.Sarama).Validate())
	return l.Err()
}

// withDefaults returns a copy with every zero field set to its default.
func (s *Scheduler) withDefaults() Scheduler {
	c := *s
	def := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = defaultBatchSize
	}
	def(&c.MaxWait, defaultMaxWait)
	def(&c.LeaderRetry, defaultLeaderRetry)
	def(&c.RetryBase, defaultRetryBase)
	def(&c.RetryMax, defaultRetryMax)
	def(&c.StatsInterval, defaultStatsInterval)
	def(&c.QueryTimeout, defaultQueryTimeout)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Sarama = producerConfig(c.Sarama)
	return c
}

func producerConfig(base *sarama.Config) *sarama.Config {
	c := sarama.NewConfig()
	if base != nil {
		cp := *base
		c = &cp
	}
	retrytopic.ConfigureProducer(c)
	return c
}

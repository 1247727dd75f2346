package schedule

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/wire"
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

// Run schedules until ctx is cancelled, then returns nil once its
// connection, producer and every goroutine it started are gone. It returns an
// error only for an invalid configuration (Validate), a key-encryption key
// it cannot read or that does not unwrap the deferred messages' data keys,
// or metrics it cannot register. Everything else (the database or the
// brokers down at start or later) is logged and retried with backoff for as
// long as it lasts.
func (s *Scheduler) Run(ctx context.Context) error {
	if err := s.Validate(); err != nil {
		return err
	}
	c := s.withDefaults()
	keks, err := seal.LoadKEKs(c.EncryptionKeyFile, c.EncryptionKey)
	if err != nil {
		return fmt.Errorf("schedule: encryption key: %w", err)
	}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return fmt.Errorf("schedule: register metrics: %w", err)
	}
	r := &runner{cfg: c, m: m, log: c.Logger.With("group", c.Group), keks: keks}
	r.leader = m.Leader.WithLabelValues(c.Group)
	r.leader.Set(0)
	e := &pglead.Election{
		Pool: c.Pool, Name: "scheduler", Table: table, Log: r.log,
		Key:     func(oid uint32) int64 { return lockKey(oid, c.Group) },
		Channel: func(oid uint32) string { return fmt.Sprintf("idem_deferred_%d", oid) },
		Retry:   c.LeaderRetry, RetryMax: c.RetryMax, Timeout: c.QueryTimeout,
		Start:  r.start,
		Lead:   r.lead,
		Leader: r.leader,
	}
	if e.Run(ctx) {
		r.close()
	}
	return r.fatal
}

// runner is one Run's state.
type runner struct {
	cfg    Scheduler
	m      *metrics
	leader prometheus.Gauge
	log    *slog.Logger
	client sarama.Client
	fwd    *forward.Forwarder
	keks   []seal.KEK   // EncryptionKeyFile's or EncryptionKey's; nil: none
	sealer *seal.Sealer // opens sealed rows (made by start); nil without keks
	fatal  error        // why start gave up for good (a wrong KEK); Run returns it
}

// start migrates the table and connects to Kafka, once; the election
// retries it with backoff until it succeeds.
func (r *runner) start(ctx context.Context) error {
	if err := tables.MigrateDeferred(ctx, r.cfg.Pool); err != nil {
		return err
	}
	if r.keks != nil && r.sealer == nil {
		if err := seal.Migrate(ctx, r.cfg.Pool); err != nil {
			return err
		}
		sl, err := seal.New(ctx, seal.Config{DB: r.cfg.Pool, KEKs: r.keks, Purpose: tables.DeferredPurpose})
		if errors.Is(err, seal.ErrWrongKEK) {
			r.fatal = fmt.Errorf("schedule: encryption at rest: %w", err)
			return pglead.ErrGiveUp
		}
		if err != nil {
			return err
		}
		r.sealer = sl
	}
	client, err := sarama.NewClient(r.cfg.Brokers, r.cfg.Sarama)
	if err != nil {
		return err
	}
	fwd, err := forward.NewForwarderFromClient(client)
	if err != nil {
		_ = client.Close()
		return err
	}
	r.client, r.fwd = client, fwd
	return nil
}

func (r *runner) close() {
	_ = r.fwd.Close()
	_ = r.client.Close()
}

// lockKey is the advisory lock key of group's leader for the table whose oid
// is given: a 64-bit FNV-1a hash of both, so each group has its own leader,
// and a group of the same name in another schema's table (advisory locks are
// database-wide) has another.
func lockKey(table uint32, group string) int64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "idem-schedule:%d:%s", table, group)
	return int64(h.Sum64())
}

// lead publishes due rows until the connection fails or ctx ends.
func (r *runner) lead(ctx context.Context, conn *pgx.Conn) error {
	var nextStats time.Time
	for {
		if now := time.Now(); !now.Before(nextStats) {
			if err := r.stats(ctx, conn); err != nil {
				return ctxOr(ctx, err)
			}
			nextStats = now.Add(r.cfg.StatsInterval)
		}
		n, err := r.round(ctx, conn)
		if err != nil {
			return ctxOr(ctx, err)
		}
		if n == r.cfg.BatchSize {
			continue // more may be due
		}
		wait, err := r.idleWait(ctx, conn)
		if err != nil {
			return ctxOr(ctx, err)
		}
		if err := pglead.Wait(ctx, conn, min(wait, time.Until(nextStats))); err != nil {
			return ctxOr(ctx, fmt.Errorf("schedule: %w", err))
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// ctxOr is nil when ctx has ended (the error is the cancellation's), else err.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// idleWait is how long until the group's next row is due, at most MaxWait.
func (r *runner) idleWait(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	var next *float64
	err := r.row(ctx, conn, `SELECT extract(epoch FROM min(due_at) - now())::float8 FROM `+table+
		` WHERE consumer_group = $1`, r.cfg.Group).Scan(&next)
	if err != nil {
		return 0, fmt.Errorf("schedule: next due time: %w", err)
	}
	return pglead.Until(next, r.cfg.MaxWait), nil
}

// due is one row to publish.
type due struct {
	id       int64
	rec      forward.Record
	attempts int
	// keyID and sealed are the row's payload sealed at rest (nil keyID:
	// in clear); dlq, ikey and origin say where its stub goes when the
	// payload cannot be opened for good.
	keyID  *int64
	sealed []byte
	dlq    string
	ikey   string
	origin handler.Origin
	// stub is why rec is the dead-letter stub of the row (nil: the row).
	stub error
}

// round publishes up to BatchSize due rows and settles them; it returns how
// many rows it read.
func (r *runner) round(ctx context.Context, conn *pgx.Conn) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := conn.Query(qctx, `SELECT id, topic, partition, key, value, header_keys, header_values, record_timestamp, attempts,
			key_id, sealed, dlq_topic, idempotency_key, origin_topic, origin_partition, origin_offset
		FROM `+table+` WHERE consumer_group = $1 AND due_at <= now() ORDER BY due_at, id LIMIT $2`, r.cfg.Group, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("schedule: read due rows: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (due, error) {
		var d due
		var hk []string
		var hv [][]byte
		var ts *time.Time
		if err := row.Scan(&d.id, &d.rec.Topic, &d.rec.Partition, &d.rec.Key, &d.rec.Value, &hk, &hv, &ts, &d.attempts,
			&d.keyID, &d.sealed, &d.dlq, &d.ikey, &d.origin.Topic, &d.origin.Partition, &d.origin.Offset); err != nil {
			return d, err
		}
		for i, k := range hk {
			d.rec.Headers = append(d.rec.Headers, sarama.RecordHeader{Key: []byte(k), Value: hv[i]})
		}
		if ts != nil {
			d.rec.Timestamp = *ts
		}
		return d, nil
	})
	if err != nil || len(batch) == 0 {
		if err != nil {
			err = fmt.Errorf("schedule: read due rows: %w", err)
		}
		return 0, err
	}
	errs := make([]error, len(batch))
	for i := range batch {
		errs[i] = r.open(ctx, &batch[i])
	}
	var wg sync.WaitGroup
	for i, d := range batch {
		if errs[i] == nil {
			wg.Go(func() { errs[i] = r.fwd.Forward(context.WithoutCancel(ctx), d.rec) })
		}
	}
	wg.Wait()
	var acked []int64
	b := &pgx.Batch{}
	for i, d := range batch {
		if errs[i] == nil {
			acked = append(acked, d.id)
			if d.stub != nil {
				r.m.DeadLettered.WithLabelValues(r.cfg.Group).Inc()
				r.log.Error("idem: a deferred message's payload cannot be opened for good; dead-lettered as a stub, never published",
					"id", d.id, "key", d.ikey, "origin", d.origin.Topic, "partition", d.origin.Partition, "offset", d.origin.Offset,
					"to", d.rec.Topic, "err", d.stub)
			}
			continue
		}
		wait := r.retryWait(d.attempts + 1)
		r.m.PublishFailures.WithLabelValues(r.cfg.Group).Inc()
		r.log.Warn("idem: publishing a due deferred record failed; will retry", "id", d.id, "topic", d.rec.Topic,
			"attempts", d.attempts+1, "err", errs[i], "in", wait)
		b.Queue(`UPDATE `+table+` SET attempts = attempts + 1, last_error = $2, due_at = now() + make_interval(secs => $3)
			WHERE id = $1`, d.id, errs[i].Error(), wait.Seconds())
	}
	if r.cfg.afterAck != nil {
		r.cfg.afterAck(acked)
	}
	if len(acked) > 0 {
		b.Queue(`DELETE FROM `+table+` WHERE id = ANY($1)`, acked)
	}
	// Kafka has the acked records: record it even if ctx was cancelled
	// meanwhile, or a clean shutdown would publish them again.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.QueryTimeout)
	defer scancel()
	if err := conn.SendBatch(sctx, b).Close(); err != nil {
		return 0, fmt.Errorf("schedule: settle published rows: %w", err)
	}
	r.m.Published.WithLabelValues(r.cfg.Group).Add(float64(len(acked)))
	return len(batch), nil
}

// open makes d's record publishable: a row sealed at rest is opened into
// it (seal.Pack's value and headers). A row whose payload cannot be opened
// for good (seal.Unreadable: its data key destroyed, or tampered with)
// becomes the dead-letter stub of its message (wire.UnreadableStub), to
// d.dlq, or the default dead-letter topic of its origin. The error is a
// failure to publish now, retried as one: no key given (seal.ErrNoKey), a
// wrong key, the database.
func (r *runner) open(ctx context.Context, d *due) error {
	if d.keyID == nil {
		return nil
	}
	if r.sealer == nil {
		return fmt.Errorf("schedule: deferred row %d: %w (give the scheduler EncryptionKeyFile)", d.id, seal.ErrNoKey)
	}
	aad := tables.DeferredAAD(r.cfg.Group, d.rec.Topic, d.rec.Partition, d.ikey, d.origin)
	pt, err := r.sealer.Open(ctx, *d.keyID, d.sealed, aad)
	var hs []seal.Header
	if err == nil {
		d.rec.Value, hs, err = seal.Unpack(pt)
	}
	switch {
	case err == nil:
		d.rec.Headers = make([]sarama.RecordHeader, len(hs))
		for i, h := range hs {
			d.rec.Headers[i] = sarama.RecordHeader{Key: h.Key, Value: h.Value}
		}
		return nil
	case !seal.Unreadable(err):
		return fmt.Errorf("schedule: deferred row %d: %w", d.id, err)
	}
	d.stub = fmt.Errorf("deferred message's payload, sealed at rest, cannot be opened: %w", err)
	dlq := d.dlq
	if dlq == "" {
		dlq = retrytopic.Policy{}.DLQ(d.origin.Topic, r.cfg.Group)
	}
	src := wire.Source{Topic: d.origin.Topic, Partition: d.origin.Partition, Offset: d.origin.Offset, Group: r.cfg.Group}
	d.rec = forward.Record{Topic: dlq, Partition: d.origin.Partition, Key: d.rec.Key,
		Headers: wire.UnreadableStub(src, d.ikey, d.stub, time.Now())}
	return nil
}

// retryWait is a random wait in [1ms, min(RetryMax, RetryBase·2^(attempts-1))].
func (r *runner) retryWait(attempts int) time.Duration {
	ceil := r.cfg.RetryBase << min(attempts-1, 30)
	if ceil <= 0 || ceil > r.cfg.RetryMax {
		ceil = r.cfg.RetryMax
	}
	return max(rand.N(ceil+1), time.Millisecond)
}

// stats refreshes idem_schedule_pending.
func (r *runner) stats(ctx context.Context, conn *pgx.Conn) error {
	var n int64
	if err := r.row(ctx, conn, `SELECT count(*) FROM `+table+` WHERE consumer_group = $1`, r.cfg.Group).Scan(&n); err != nil {
		return fmt.Errorf("schedule: stats: %w", err)
	}
	r.m.Pending.WithLabelValues(r.cfg.Group).Set(float64(n))
	return nil
}

func (r *runner) row(ctx context.Context, conn *pgx.Conn, sql string, args ...any) pgx.Row {
	return pglead.QueryRow(ctx, conn, r.cfg.QueryTimeout, sql, args...)
}

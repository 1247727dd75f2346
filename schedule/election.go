package schedule

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
)

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

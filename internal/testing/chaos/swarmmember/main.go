// Command swarmmember is a member of the swarm's consumer group (issue 28;
// internal/testing/tools/swarm builds and launches it): a consumer built from one
// draw of the feature lattice (internal/testing/chaos/draw) through idem's public
// API only, whose handler does what each record's chaos-* headers ask (fail
// so many attempts, fail with a rule's error, defer, call a dependency
// behind a breaker, be slow), writes a ledger row per success in the
// message's transaction (and an outbox event with Outbox), and records
// every call, and every run of OnDeadLettered and OnExpired, for the
// checker.
//
//	swarmmember -config FILE -member NAME -history FILE [-instance-id ID]
//
// It reads KAFKA_BROKERS and DATABASE_URL, logs to stderr, and exits 0 when
// SIGTERM or SIGINT stopped it cleanly.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/chaos/draw"
	"github.com/idemhq/idem/internal/testing/chaos/memberkit"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/schedule"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "swarm-member: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	var configPath, name, history, instance string
	fs := flag.NewFlagSet("swarmmember", flag.ContinueOnError)
	fs.StringVar(&configPath, "config", "", "the draw's member configuration (JSON, draw.Member)")
	fs.StringVar(&name, "member", "", "this member's name in the history and the ledger")
	fs.StringVar(&history, "history", "", "append each handler call to this JSON-lines file")
	fs.StringVar(&instance, "instance-id", "", "Config.InstanceID (static membership)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	b, err := os.ReadFile(configPath)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	var m draw.Member
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("config %s: %w", configPath, err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")

	pool, err := connect(ctx, log, os.Getenv("DATABASE_URL"))
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	if err := migrate(ctx, log, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	hist, err := memberkit.OpenHistory(history)
	if err != nil {
		return err
	}
	s := &service{m: &m, member: name, hist: hist}
	cfg, err := s.config(pool, brokers, instance, log)
	if err != nil {
		return errors.Join(err, hist.Close())
	}
	var h handler.Handler = handler.Func(s.handle)
	if m.BatchHandler {
		h = handler.Batch(s.handleBatch)
	}
	stopRelay := func() {}
	if m.Outbox {
		stopRelay = startRelay(ctx, log, &outbox.Relay{Pool: pool, Brokers: brokers, Sarama: cfg.Sarama, Logger: log, ExactlyOnce: m.OutboxEO})
	}
	log.Info("mode", "member", name, "instance_id", instance, "config", string(b))
	err = consumer.Run(ctx, cfg, h)
	stopRelay()
	return errors.Join(err, hist.Close())
}

// connect opens the pool and waits up to a minute for PostgreSQL (it may be
// restarting: a supervisor would start the member again, and the harness
// does, but a start that waits is cheaper).
func connect(ctx context.Context, log *slog.Logger, url string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	err = retry(ctx, log, "PostgreSQL", func() error { return pool.Ping(ctx) })
	if err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// retry runs f until it succeeds, ctx ends or a minute passes.
func retry(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	deadline := time.Now().Add(time.Minute)
	for n := 1; ; n++ {
		err := f()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		log.Warn("start: waiting for "+what, "try", n, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// hooksSchema is the hooks' ledger: one row per run of OnDeadLettered and
// OnExpired, written in the hook's transaction, no unique key.
const hooksSchema = `
CREATE TABLE IF NOT EXISTS chaos_hooks (
	id               bigserial PRIMARY KEY,
	hook             text NOT NULL,
	seq              bigint NOT NULL,
	idempotency_key  text NOT NULL,
	topic            text NOT NULL,
	member           text NOT NULL,
	origin_topic     text NOT NULL,
	origin_partition int NOT NULL,
	origin_offset    bigint NOT NULL,
	kind             text NOT NULL,
	at               timestamptz NOT NULL DEFAULT clock_timestamp()
);`

// migrate creates idem's tables and the chaos ledgers, one member at a
// time (CREATE TABLE IF NOT EXISTS alone can race in PostgreSQL).
func migrate(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool) error {
	return retry(ctx, log, "the migration", func() error {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(2028)`); err != nil {
			return err
		}
		defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(2028)`) //nolint:errcheck // the session ends with the connection anyway
		if err := idem.Migrate(ctx, pool); err != nil {
			return err
		}
		_, err = conn.Exec(ctx, memberkit.EffectsSchema+hooksSchema)
		return err
	})
}

// startRelay runs rl until ctx ends or the returned stop is called.
func startRelay(ctx context.Context, log *slog.Logger, rl *outbox.Relay) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := rl.Run(ctx); err != nil {
			log.Error("outbox relay stopped", "err", err)
		}
	}()
	return func() { cancel(); <-done }
}

// service is the member's handler, hooks and dependencies.
type service struct {
	m        *draw.Member
	member   string
	hist     *memberkit.HistoryLog
	deps     *breaker.Set // dependencies A and B (nil without Breaker and Throttle)
	inFlight inFlight
}

// config is the consumer.Config of the draw.
func (s *service) config(pool *pgxpool.Pool, brokers []string, instance string, log *slog.Logger) (consumer.Config, error) {
	m := s.m
	scfg := sarama.NewConfig()
	scfg.Version = sarama.V4_0_0_0
	scfg.ClientID = "swarm-member"
	scfg.Consumer.Group.Session.Timeout = m.SessionTimer.D()
	fb := m.Fallback()
	cfg := consumer.Config{
		Brokers: brokers, Group: m.Group, Topics: []string{m.Topic},
		Dedupe: dedupe.NewPostgres(pool), Sarama: scfg, Logger: log,
		InstanceID:  instance,
		Concurrency: m.Concurrency,
		Batch:       consumer.BatchConfig{MaxMessages: m.BatchSize},
		Retry: consumer.RetryConfig{Attempts: fb.Attempts, Backoff: fb.Backoff, Tiers: fb.Retry,
			Rules: m.Rules(recovery.Is(errLadder), recovery.Is(errFraud))},
		Expiry:           consumer.Expiry{MaxAge: m.MaxAge.D()},
		DLQDepthInterval: -1,
		LagInterval:      -1,
	}
	if m.Transactions {
		cfg.Transactions = consumer.TransactionsConfig{Enabled: true, Timeout: m.TxnTimeout.D()}
	}
	if m.AdaptiveMax > 0 {
		cfg.Limits.Adaptive = &consumer.Adaptive{Max: m.AdaptiveMax}
	}
	if m.Ordering {
		cfg.Ordering = consumer.ByKey(pool)
	}
	if m.Defer {
		cfg.Defer = &schedule.Scheduler{Pool: pool}
	}
	if m.HookDLQ {
		cfg.OnDeadLettered = s.onDeadLettered
	}
	if m.HookExpired {
		cfg.Expiry.OnExpired = s.onExpired
	}
	if m.Breaker != nil || len(m.Throttle) > 0 {
		set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 2, OpenTimeout: max(m.BreakerOpen.D(), time.Second)})
		if err != nil {
			return cfg, err
		}
		if b := m.Breaker; b != nil {
			if err := set.SetLimits("A", breaker.Limits{Rate: b.Rate, Burst: b.Burst, MaxInFlight: b.MaxInFlight}); err != nil {
				return cfg, err
			}
		}
		s.deps = set
		cfg.Limits.Breakers = set
	}
	return cfg, cfg.Validate()
}

package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
)

// This file is how a relay runs: Run, the session that holds its state,
// its start-up, and its part in the table's leader election
// (internal/pglead's Election); Relay's doc, "Leadership", says how.

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

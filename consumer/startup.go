package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// setup runs Run's start-up steps, before the group is joined: connecting
// and creating the retry topics with retries while the cluster moves its
// leaders, and the warnings about a configuration that would lose or skip
// records.
type setup struct {
	cfg    Config
	policy retrytopic.Policy
	rules  *recovery.Policy
	log    *slog.Logger
	order  bool // ordering by key is on
}

// startRetryFor bounds how long Run's start-up steps that talk to the
// cluster's controller (creating the retry and dead-letter topics) retry a
// broker that does not answer. A broker killed in a multi-node cluster keeps
// being named as controller or leader until the quorum fences it (about 9 s
// with Kafka's defaults); within this bound Run waits that out instead of
// failing at start. Beyond it Run fails as documented, so a cluster that is
// really unreachable is still reported.
const startRetryFor = 30 * time.Second

// transientClusterErr reports whether err from an admin request means "this
// broker (or the controller we know of) did not answer" rather than "the
// cluster refused": a refused or reset connection, EOF, a timeout, or one of
// Kafka's not-available / not-controller codes. sarama's "run out of available
// brokers" counts only through the connection errors it wraps, so a refused
// SASL login or TLS handshake behind it is not retried. Those are worth a retry after
// a metadata refresh; anything else (authorization, a partition mismatch, bad
// config) is returned at once.
//
// PostgreSQL that cannot be reached, or that answers with an outage SQLSTATE
// (sqlClass, the handler's list: connection 08, 57P01–57P03 starting or
// shutting down, ...) counts too: the ordering schema is migrated at start,
// and a database restart then is an outage like a broker's.
func transientClusterErr(err error) bool {
	var ce *pgconn.ConnectError
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe): // also inside a ConnectError: a refused login is final
		return sqlClass(pe.Code) == classOutage // the handler's SQLSTATE outages, one list
	case forward.IsUnreachable(err), errors.As(err, &ce):
		return true
	case pgconn.SafeToRetry(err): // a connection closed under a statement before it was sent ("conn closed": a restart)
		return true
	}
	return false
}

// retryStart runs step until it succeeds, returns an error that is not
// transientClusterErr, ctx ends, or startRetryFor has passed since the first
// failure. Between tries it refreshes the client's controller and metadata
// (so a fenced broker is dropped; client may be nil before one exists) and waits 250 ms, doubling to 2 s. Each
// retried failure is logged at WARN.
func (s setup) retry(ctx context.Context, client sarama.Client, what string, step func() error) error {
	wait := 250 * time.Millisecond
	var deadline time.Time
	for {
		err := tryStep(ctx, what, step)
		if err == nil || !transientClusterErr(err) {
			return err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(startRetryFor)
		}
		if now.After(deadline) {
			return err
		}
		s.log.Warn("idem: "+what+" failed; retrying (a broker or the database restarting, or the cluster moving its leaders)", "err", err, "in", wait)
		if !sleep(ctx, wait) {
			return err
		}
		if client != nil {
			_, _ = client.RefreshController()
			_ = client.RefreshMetadata()
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// tryStep runs step once, unless a test hook fails this try first.
func tryStep(ctx context.Context, what string, step func() error) error {
	if h := hooksOf(ctx); h != nil && h.startStep != nil {
		if err := h.startStep(what); err != nil {
			return err
		}
	}
	return step()
}

// subscribed returns the topics the group subscribes to: the sources and
// their retry tiers (Retry's, those of the rules' own ladders, and every
// route's).
func subscribed(cfg Config) []string {
	ts := append([]string(nil), cfg.Topics...)
	for _, t := range cfg.Topics {
		ts = append(ts, cfg.tierTopics(t)...)
	}
	ts = append(ts, cfg.deferredTopics()...)
	return ts
}

func checkTopics(client sarama.Client, topics []string) error {
	if err := client.RefreshMetadata(topics...); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return fmt.Errorf("consumer: metadata: %w", err)
	}
	known, err := client.Topics()
	if err != nil {
		return fmt.Errorf("consumer: metadata: %w", err)
	}
	have := map[string]bool{}
	for _, t := range known {
		have[t] = true
	}
	var errs []error
	for _, t := range topics {
		if !have[t] {
			errs = append(errs, fmt.Errorf("%w %q: create it first (idem creates only its retry and dead-letter topics)", ErrUnknownTopic, t))
		}
	}
	return errors.Join(errs...)
}

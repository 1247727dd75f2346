package payments

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/recovery"
)

// startWithin bounds how long the service's own start-up steps (PostgreSQL,
// the migrations, its topics) wait for a server that is restarting or not
// up yet, before it gives up with the last error. consumer.Run rides out
// the same outages for its own steps.
const startWithin = 60 * time.Second

// startBackoff spaces the tries: full jitter, up to 2 s apart.
var startBackoff = recovery.Backoff{Base: 100 * time.Millisecond, Max: 2 * time.Second}

// retryStart runs step until it succeeds, ctx ends, startWithin passes, or
// it fails with an error no wait would mend (see outage). Each failed try
// that will be retried is logged as a warning naming what it waits for.
func retryStart(ctx context.Context, log *slog.Logger, what string, step func(context.Context) error) error {
	deadline := time.Now().Add(startWithin)
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for n := 1; ; n++ {
		err := step(ctx)
		if err == nil || !outage(err) || ctx.Err() != nil {
			return err
		}
		wait := startBackoff.Delay(n, r)
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("%w (gave up after %s of retries)", err, startWithin)
		}
		log.Warn("start: a server is not reachable yet; retrying", "step", what, "try", n, "in", wait.Round(time.Millisecond), "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// outage reports whether err is one a restarting broker or database causes:
// a refused, reset or timed-out connection, sarama running out of brokers or
// finding no leader, or PostgreSQL saying it is starting, shutting down or
// out of connections. A refused login, a missing database, bad SQL or a bad
// flag is not: waiting would not mend it.
func outage(err error) bool {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code[:2] {
		case "08", "53", "57", "58":
			return true
		}
		return false
	}
	if errors.Is(err, sarama.ErrOutOfBrokers) || errors.Is(err, sarama.ErrNotController) ||
		errors.Is(err, sarama.ErrLeaderNotAvailable) || errors.Is(err, sarama.ErrNotLeaderForPartition) ||
		errors.Is(err, sarama.ErrRequestTimedOut) || errors.Is(err, sarama.ErrBrokerNotAvailable) ||
		errors.Is(err, sarama.ErrClosedClient) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	// A dial that failed (no PostgreSQL error inside): refused, reset, or
	// the server not up yet.
	var ce *pgconn.ConnectError
	return errors.As(err, &ce)
}

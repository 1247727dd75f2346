package payments

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
)

// TestReadyzReportsRelayThatCannotStart (issue 18 #4, moved here with
// consumer.Config.Relay's removal): the service's relay, run next to the
// consumer, whose database is unreachable keeps retrying its start, and
// meanwhile the service's /readyz check names the relay's failure; without
// a relay it is the consumer's Readiness alone.
func TestReadyzReportsRelayThatCannotStart(t *testing.T) {
	t.Parallel()
	bad, err := pgxpool.New(context.Background(), "postgres://idem:idem@127.0.0.1:1/idem?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bad.Close)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rl := eventsRelay(true, bad, []string{"127.0.0.1:1"}, saramaConfig("payments-relay-test"), log, prometheus.NewRegistry())
	rl.LeaderRetry, rl.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	stop := startRelay(ctx, rl, log)
	t.Cleanup(func() { cancel(); stop() })
	ready := readyFunc(consumer.NewReadiness(), rl)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ready(context.Background())
		if err != nil && strings.Contains(err.Error(), "outbox relay not running") && !errors.Is(err, consumer.ErrNotReady) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz = %v, want the outbox relay's failure", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := readyFunc(consumer.NewReadiness(), nil)(context.Background()); !errors.Is(err, consumer.ErrNotReady) {
		t.Fatalf("readyz without a relay = %v, want the consumer's %v", err, fmt.Sprint(consumer.ErrNotReady))
	}
}

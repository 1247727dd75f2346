package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/outbox"
)

// TestReadinessReportsRelayThatCannotStart (issue 18 #4): a Config.Relay
// whose database is unreachable keeps retrying its start, and meanwhile the
// consumer's Readiness is not ready and names the relay's failure, though
// the group is joined and the inbox is reachable. The relay of a Config with
// a Health of its own reports there too.
func TestReadinessReportsRelayThatCannotStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	bad, err := pgxpool.New(context.Background(), "postgres://idem:idem@127.0.0.1:1/idem?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bad.Close)
	health := new(outbox.Health)
	cfg := e.config()
	cfg.Readiness = consumer.NewReadiness()
	cfg.Relay = &outbox.Relay{Pool: bad, Health: health, LeaderRetry: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond}
	start(t, cfg, effectHandler())
	e.produce([]string{"k1"}, 1)
	e.waitEffect("k1", 60*time.Second) // joined and consuming
	testenv.Eventually(t, 30*time.Second, func() error {
		err := cfg.Readiness.Check(context.Background())
		if !errors.Is(err, consumer.ErrNotReady) || !strings.Contains(err.Error(), "outbox relay") {
			return fmt.Errorf("Check = %v, want not ready because of the outbox relay", err)
		}
		if health.Err() == nil {
			return errors.New("the Config's own Health says the relay runs")
		}
		return nil
	})
}

package consumer_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/internal/steptable"
	"github.com/idemhq/idem/internal/testenv"
)

// TestRunSweepsSteps: Run's inbox sweeper also deletes the rows of
// idem_steps older than the inbox's retention (a step is useful as long as
// its message's key is in the inbox), keeps the recent ones, and leaves
// them all with Retention.NoSweep.
func TestRunSweepsSteps(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		retention consumer.RetentionConfig
		swept     bool
	}{{"default 14 days", consumer.RetentionConfig{}, true}, {"disabled", consumer.RetentionConfig{NoSweep: true}, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			ctx := testenv.Context(t)
			if err := steptable.Migrate(ctx, e.pool); err != nil {
				t.Fatal(err)
			}
			if _, err := e.pool.Exec(ctx, `INSERT INTO idem_steps (consumer_group, idempotency_key, step, status, result, recorded_at) VALUES
				('g', 'old', 'charge', 'done', '1', now() - interval '15 days'), ('g', 'recent', 'charge', 'done', '1', now() - interval '13 days')`); err != nil {
				t.Fatal(err)
			}
			cfg := e.config()
			cfg.Retention = c.retention
			e.produce([]string{"k1"}, 1)
			start(t, cfg, effectHandler())
			e.waitCommitted(e.topic, 1, 60*time.Second)
			if c.swept {
				testenv.Eventually(t, 30*time.Second, func() error {
					if n := e.count(`SELECT count(*) FROM idem_steps WHERE idempotency_key = 'old'`); n != 0 {
						return errors.New("the 15-day-old step is still there")
					}
					return nil
				})
			} else if n := e.count(`SELECT count(*) FROM idem_steps WHERE idempotency_key = 'old'`); n != 1 {
				t.Fatalf("Retention.NoSweep swept the old step")
			}
			if n := e.count(`SELECT count(*) FROM idem_steps WHERE idempotency_key = 'recent'`); n != 1 {
				t.Fatalf("the recent step was swept")
			}
		})
	}
}

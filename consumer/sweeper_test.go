package consumer_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// TestRunSweepsTheInbox: with a PostgreSQL store Run deletes inbox rows
// older than Config.Retention.Keep on its own, and the rows of idem_steps
// with the same retention (a step is useful as long as its message's key
// is in the inbox), and keeps the recent ones; with Retention.NoSweep it
// leaves them.
func TestRunSweepsTheInbox(t *testing.T) {
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
			if _, err := e.pool.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key, processed_at) VALUES
				('other-group', 'old', now() - interval '15 days'), ('other-group', 'recent', now() - interval '13 days')`); err != nil {
				t.Fatal(err)
			}
			if err := tables.MigrateSteps(ctx, e.pool); err != nil {
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
					if n := e.count(`SELECT count(*) FROM idem_processed WHERE idempotency_key = 'old'`); n != 0 {
						return errors.New("the 15-day-old row is still there")
					}
					if n := e.count(`SELECT count(*) FROM idem_steps WHERE idempotency_key = 'old'`); n != 0 {
						return errors.New("the 15-day-old step is still there")
					}
					return nil
				})
			} else if n := e.count(`SELECT count(*) FROM idem_processed WHERE idempotency_key = 'old'`) + e.count(`SELECT count(*) FROM idem_steps WHERE idempotency_key = 'old'`); n != 2 {
				t.Fatalf("Retention.NoSweep swept the old rows")
			}
			if n := e.count(`SELECT count(*) FROM idem_processed WHERE idempotency_key IN ('recent', 'k1')`); n != 2 {
				t.Fatalf("%d of the recent rows left, want 2", n)
			}
			if n := e.count(`SELECT count(*) FROM idem_steps WHERE idempotency_key = 'recent'`); n != 1 {
				t.Fatalf("the recent step was swept")
			}
		})
	}
}

// TestRetentionValidation: Retention.Keep must cover the retry-tier and DLQ
// topics' retention (the replay window) and the sweeper's minimum when Run
// sweeps, and is never negative.
func TestRetentionValidation(t *testing.T) {
	base := consumer.Config{Brokers: []string{"k:9092"}, Group: "g", Topics: []string{"t"}, Dedupe: dedupe.NewPostgres(nil)}
	for _, c := range []struct {
		name      string
		retention consumer.RetentionConfig
		policy    retrytopic.Policy
		ok        bool
	}{
		{"default", consumer.RetentionConfig{}, retrytopic.Policy{}, true},
		{"not swept", consumer.RetentionConfig{NoSweep: true}, retrytopic.Policy{}, true},
		{"not swept, short", consumer.RetentionConfig{Keep: time.Minute, NoSweep: true}, retrytopic.Policy{}, true},
		{"equal to tiers", consumer.RetentionConfig{Keep: 7 * 24 * time.Hour}, retrytopic.Policy{}, true},
		{"shorter than the default tier retention", consumer.RetentionConfig{Keep: 3 * 24 * time.Hour}, retrytopic.Policy{}, false},
		{"shorter than a long tier retention", consumer.RetentionConfig{Keep: 20 * 24 * time.Hour}, retrytopic.Policy{Retention: 30 * 24 * time.Hour}, false},
		{"default shorter than a long tier retention", consumer.RetentionConfig{}, retrytopic.Policy{Retention: 30 * 24 * time.Hour}, false},
		{"short tiers", consumer.RetentionConfig{Keep: 2 * time.Hour}, retrytopic.Policy{Retention: time.Hour, Delays: []time.Duration{time.Minute}}, true},
		{"below the minimum", consumer.RetentionConfig{Keep: 30 * time.Minute}, retrytopic.Policy{Retention: time.Minute}, false},
		{"negative", consumer.RetentionConfig{Keep: -1, NoSweep: true}, retrytopic.Policy{}, false},
	} {
		if c.ok {
			// A store Run does not sweep ignores the sweeper's bounds.
			mem := base
			mem.Dedupe, mem.Retention, mem.Retry.Tiers = dedupe.NewMemory(), consumer.RetentionConfig{Keep: 30 * time.Minute}, c.policy
			if err := mem.Validate(); err != nil {
				t.Errorf("%s with a memory store: %v", c.name, err)
			}
		}
		cfg := base
		cfg.Retention, cfg.Retry.Tiers = c.retention, c.policy
		err := cfg.Validate()
		switch {
		case c.ok && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case !c.ok && (!slices.Contains(coreConfigFields(err), "Retention.Keep") || !errors.Is(err, consumer.ErrInvalidConfig)):
			t.Errorf("%s: err = %v, want a problem of Retention.Keep", c.name, err)
		}
	}
}

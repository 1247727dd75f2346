package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/schedule"
)

// TestDeferUntil is issue 21 test 5 (without the SIGKILL; schedule's
// TestLeaderSIGKILLLosesNone kills the scheduler's leader): a handler defers
// 100 messages by 5 s. The partitions keep flowing meanwhile (100 messages
// produced after them are all applied first), each deferred message is
// handled once, not before its time, as the same message (same idempotency
// key, same origin), and nothing is left in idem_deferred.
func TestDeferUntil(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := testenv.Context(t)
	if err := consumer.Migrate(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.k.DeleteTopics(t, consumer.DeferredTopic(e.topic, e.group)) })
	const delay = 5 * time.Second
	type first struct {
		until  time.Time
		origin handler.Origin
	}
	var (
		mu       sync.Mutex
		deferred = map[string]first{}
		handled  = map[string]time.Time{}
		early    []string
		moved    []string
	)
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if !strings.HasPrefix(m.IdempotencyKey, "d-") {
			return eff(ctx, m)
		}
		mu.Lock()
		f, seen := deferred[m.IdempotencyKey]
		if !seen {
			until := time.Now().Add(delay)
			deferred[m.IdempotencyKey] = first{until, m.Origin()}
			mu.Unlock()
			return handler.DeferUntil(until)
		}
		now := time.Now()
		if now.Before(f.until) {
			early = append(early, m.IdempotencyKey)
		}
		if m.Origin() != f.origin {
			moved = append(moved, fmt.Sprintf("%s: %+v, first %+v", m.IdempotencyKey, m.Origin(), f.origin))
		}
		handled[m.IdempotencyKey] = now
		mu.Unlock()
		return eff(ctx, m)
	})
	cfg := e.config()
	cfg.Defer = &schedule.Scheduler{Pool: e.pool}
	start(t, cfg, h)
	e.produce(coreKeys("d-", 100), 2)
	e.produce(coreKeys("f-", 100), 2)

	// The partitions flow: the later messages are all applied while the
	// deferred ones wait.
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'f-%'`); n != 100 {
			return fmt.Errorf("%d of 100 later messages applied", n)
		}
		return nil
	})
	mu.Lock()
	nDeferred, nHandled := len(deferred), len(handled)
	mu.Unlock()
	if nDeferred != 100 || nHandled != 0 {
		t.Fatalf("when the later messages were applied: %d deferred, %d deferred ones handled; want 100, 0", nDeferred, nHandled)
	}
	e.waitCommitted(e.topic, 2, 30*time.Second) // offsets of deferred messages commit at once

	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'd-%'`); n != 100 {
			return fmt.Errorf("%d of 100 deferred messages applied", n)
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d`); n != 0 {
		t.Errorf("%d keys applied more than once", n)
	}
	mu.Lock()
	if len(early) > 0 || len(moved) > 0 {
		t.Errorf("handled before their time: %v; with another origin: %v", early, moved)
	}
	mu.Unlock()
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM ` + schedule.Table); n != 0 {
			return fmt.Errorf("%d rows left in %s", n, schedule.Table)
		}
		return nil
	})
	if got := gatherSum(t, e.reg, "idem_deferred_total", nil); got != 100 {
		t.Errorf("idem_deferred_total = %v, want 100", got)
	}
	if got := coreOutcome(t, e.reg, metrics.OutcomeDeferred); got != 100 {
		t.Errorf("idem_messages_total{outcome=deferred} = %d, want 100", got)
	}
	if got := gatherSum(t, e.reg, "idem_retries_total", nil); got != 0 {
		t.Errorf("idem_retries_total = %v, want 0 (a deferral is not a failure)", got)
	}
	if n := e.total(e.dlq(), 2); n != 0 {
		t.Errorf("DLQ holds %d records, want 0", n)
	}
}

// TestDeferUntilWithoutConfig: without Config.Defer a deferring handler's
// message is dead-lettered (permanent) saying why; nothing stalls.
func TestDeferUntilWithoutConfig(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	var c calls
	start(t, e.config(), handler.Func(func(ctx context.Context, m *handler.Message) error {
		c.inc(m.IdempotencyKey)
		return handler.Defer(time.Hour)
	}))
	e.produce([]string{"a"}, 1)
	e.waitCommitted(e.topic, 1, 60*time.Second)
	rec := e.coreReadRecords(e.dlq(), 0, 1, 30*time.Second)[0]
	if k, msg := header(rec, "idem-error-kind"), header(rec, "idem-error"); k != string(handler.KindPermanent) || !strings.Contains(msg, "Config.Defer") {
		t.Errorf("DLQ record: kind %q error %q, want permanent naming Config.Defer", k, msg)
	}
	if n := c.get("a"); n != 1 {
		t.Errorf("handler called %d times, want 1 (no retries)", n)
	}
}

// TestDeferConfigRejected: a Defer without a pool, or for another group, is
// a start error.
func TestDeferConfigRejected(t *testing.T) {
	for name, s := range map[string]*schedule.Scheduler{
		"no pool":     {},
		"other group": {Pool: testenv.Postgres(t), Group: "other"},
	} {
		cfg := coreValidConfig()
		cfg.Defer = s
		var ce *consumer.ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != "Defer" {
			t.Errorf("%s: Validate = %v, want a *ConfigError for Defer", name, err)
		}
	}
}

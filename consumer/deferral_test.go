package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/schedule"
)

// TestDeferUntil is issue 21 test 5 (without the SIGKILL; schedule's
// TestLeaderSIGKILLLosesNone kills the scheduler's leader): a handler defers
// 100 messages by an hour. The partitions keep flowing meanwhile (100
// messages produced after them are all applied while the deferred ones
// wait, each stored with the time asked for); the test then makes them due
// (releaseDeferred), and each deferred message is handled once, not before
// its release, as the same message (same idempotency key, same origin), and
// nothing is left in idem_deferred. The deferral is an hour, released by
// the test, because a deferral of seconds ran out before the later
// messages were applied on a loaded machine.
func TestDeferUntil(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := testenv.Context(t)
	if err := schema.Migrate(ctx, e.pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.k.DeleteTopics(t, e.topic+"."+e.group+".deferred") })
	const delay = time.Hour
	type first struct {
		until  time.Time
		origin handler.Origin
	}
	var (
		mu       sync.Mutex
		deferred = map[string]first{}
		handled  = map[string]time.Time{}
		released time.Time // zero until releaseDeferred
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
		if released.IsZero() || now.Before(released) {
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
	cfg.Defer = e.deferScheduler()
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
	e.waitCommitted(e.topic, 2, 30*time.Second) // offsets of deferred messages commit at once
	mu.Lock()
	nDeferred, nHandled := len(deferred), len(handled)
	mu.Unlock()
	if nDeferred != 100 || nHandled != 0 {
		t.Fatalf("when the later messages were applied and the offsets committed: %d deferred, %d deferred ones handled; want 100, 0", nDeferred, nHandled)
	}
	// Each is stored with the time its handler asked for (and an hour is
	// far beyond any test's run: nothing is due before the release).
	if n := e.count(`SELECT count(*) FROM idem_deferred WHERE consumer_group = $1 AND deferred_until > now() + interval '30 minutes'`, e.group); n != 100 {
		t.Fatalf("%d of 100 deferrals stored with the time asked for", n)
	}
	mu.Lock()
	released = time.Now()
	mu.Unlock()
	e.releaseDeferred()

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
		t.Errorf("handled before their release: %v; with another origin: %v", early, moved)
	}
	mu.Unlock()
	testenv.Eventually(t, 30*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM ` + "idem_deferred"); n != 0 {
			return fmt.Errorf("%d rows left in %s", n, "idem_deferred")
		}
		return nil
	})
	if got := gatherSum(t, e.reg, "idem_deferred_total", nil); got != 100 {
		t.Errorf("idem_deferred_total = %v, want 100", got)
	}
	if got := coreOutcome(t, e.reg, coremetrics.OutcomeDeferred); got != 100 {
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
		return handler.DeferUntil(time.Now().Add(time.Hour))
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
		if err := cfg.Validate(); !slices.Contains(coreConfigFields(err), "Defer") {
			t.Errorf("%s: Validate = %v, want a problem of Defer", name, err)
		}
	}
}

// deferHandler defers every message read from its source topic by delay and
// applies it when it comes back from the deferred topic.
func deferHandler(source string, delay time.Duration) handler.Func {
	eff := effectHandler()
	return func(ctx context.Context, m *handler.Message) error {
		if m.Topic == source {
			return handler.DeferUntil(time.Now().Add(delay))
		}
		return eff(ctx, m)
	}
}

// TestDeferHelperProcess is not a test: TestDeferLeaderSIGKILLLosesNone runs
// the test binary again with only this function (startHelperProcess: its
// settings come in the crash helper's variables, crash_test.go), and
// SIGKILLs it. It runs consumer.Run with Config.Defer and deferHandler (10 s),
// so it stores the messages and leads the group's scheduler. Outside that
// child it returns at once.
func TestDeferHelperProcess(t *testing.T) {
	if !testenv.InChild("TestDeferHelperProcess") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // the parent kills us long before
	defer cancel()
	cfg, pool := helperConfig(t, ctx, deferAppName(os.Getenv(crashEnvSchema)))
	cfg.CommitInterval = 100 * time.Millisecond
	cfg.Defer = &schedule.Scheduler{Pool: pool}
	err := consumer.Run(ctx, cfg, deferHandler(cfg.Topics[0], 10*time.Second))
	t.Fatalf("defer helper: Run returned %v before it was killed", err)
}

// deferAppName is the application_name of the defer helper's sessions.
func deferAppName(schema string) string { return "idem-defer-helper-" + schema }

// TestDeferLeaderSIGKILLLosesNone is the SIGKILL part of issue 21 test 5 at
// the consumer's level: a member that deferred 100 messages by 10 s and
// leads the group's scheduler is SIGKILLed before they are due; a member
// started after it takes the partitions and the scheduler's lead, and every
// deferred message is handled once.
func TestDeferLeaderSIGKILLLosesNone(t *testing.T) {
	t.Parallel()
	const partitions = 2
	e := newEnv(t, partitions)
	ctx := testenv.Context(t)
	if err := schema.Migrate(ctx, e.pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.k.DeleteTopics(t, e.topic+"."+e.group+".deferred") })
	e.produce(coreKeys("d-", 100), partitions)

	child := e.startHelperProcess("TestDeferHelperProcess")

	// The helper stored all 100 and holds the scheduler's advisory lock.
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM ` + "idem_deferred"); n != 100 {
			return fmt.Errorf("%d of 100 deferred", n)
		}
		if n := e.count(`SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = left($1, 63)`, deferAppName(e.coreSchema())); n == 0 {
			return errors.New("the helper does not lead the scheduler yet")
		}
		return nil
	})
	child.Kill(t) // fails the test if the helper ended before it was killed
	if n := e.count(`SELECT count(*) FROM ` + "idem_deferred"); n != 100 {
		t.Fatalf("%d rows left at the kill, want 100 (killed before they were due)", n)
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("%d effects before the kill, want 0", n)
	}

	cfg := e.config()
	cfg.Defer = &schedule.Scheduler{Pool: e.pool}
	start(t, cfg, deferHandler(e.topic, 10*time.Second))
	testenv.Eventually(t, 90*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects`); n < 100 {
			return fmt.Errorf("%d of 100 deferred messages applied", n)
		}
		if n := e.count(`SELECT count(*) FROM ` + "idem_deferred"); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
	e.coreAssertOnePerKey(100)
}

// startHelperProcess runs the test binary again with only the test named
// run (testenv.StartChild), with the crash helper's variables for e and
// env's entries.
func (e *env) startHelperProcess(run string, env ...string) *testenv.Child {
	e.t.Helper()
	return testenv.StartChild(e.t, run, append([]string{
		crashEnvTopic + "=" + e.topic, crashEnvGroup + "=" + e.group, crashEnvSchema + "=" + e.coreSchema(),
		crashEnvBrokers + "=" + strings.Join(e.k.Brokers, ","), crashEnvDB + "=" + testenv.DatabaseURL(e.t),
	}, env...)...)
}

// helperConfig is the Config of a helper process (TestDeferHelperProcess,
// TestHooksHelperProcess) from the crash helper's variables, with a pool on
// the test's schema named appName (closed at the test's end) and the
// broker's shortest session, so the killed member is evicted soon.
func helperConfig(t *testing.T, ctx context.Context, appName string) (consumer.Config, *pgxpool.Pool) {
	pcfg, err := pgxpool.ParseConfig(os.Getenv(crashEnvDB))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(crashEnvSchema)
	pcfg.ConnConfig.RuntimeParams["application_name"] = appName
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	scfg := sarama.NewConfig()
	scfg.Version = testenv.KafkaVersion
	scfg.Consumer.Group.Session.Timeout = 6 * time.Second // the broker's minimum
	scfg.Consumer.Group.Heartbeat.Interval = time.Second
	return consumer.Config{
		Brokers: strings.Split(os.Getenv(crashEnvBrokers), ","),
		Group:   os.Getenv(crashEnvGroup),
		Topics:  []string{os.Getenv(crashEnvTopic)},
		Dedupe:  dedupe.NewPostgres(pool),
		Sarama:  scfg,
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
	}, pool
}

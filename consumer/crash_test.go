package consumer_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// Environment of the crash helper process.
const (
	crashEnvTopic   = "IDEM_CRASH_TOPIC"
	crashEnvGroup   = "IDEM_CRASH_GROUP"
	crashEnvSchema  = "IDEM_CRASH_SCHEMA"
	crashEnvLimit   = "IDEM_CRASH_LIMIT"
	crashEnvBrokers = "IDEM_CRASH_BROKERS"
	crashEnvDB      = "IDEM_CRASH_DATABASE_URL"
	crashEnvMode    = "IDEM_CRASH_MODE" // the parent's testMode
)

// TestCrashHelperProcess is not a test: TestCrashAfterCommitBeforeOffsetCommit
// runs the test binary again with only this function (testenv.StartChild),
// and SIGKILLs it. It runs consumer.Run with a one-hour CommitInterval, so no
// offset is committed before the kill; its handler writes the effects of the
// first IDEM_CRASH_LIMIT messages and then blocks (holding its transaction
// open) until the process dies. Outside that child it returns at once.
func TestCrashHelperProcess(t *testing.T) {
	if !testenv.InChild("TestCrashHelperProcess") {
		return
	}
	limit, err := strconv.Atoi(os.Getenv(crashEnvLimit))
	if err != nil {
		t.Fatal(err)
	}
	// A safety net: the parent kills us long before this.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(os.Getenv(crashEnvDB))
	if err != nil {
		t.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = os.Getenv(crashEnvSchema)
	// Named, so that the parent can wait for its sessions to end.
	pcfg.ConnConfig.RuntimeParams["application_name"] = crashAppName(os.Getenv(crashEnvSchema))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	scfg := sarama.NewConfig()
	scfg.Version = testenv.KafkaVersion
	// The broker's minimum, so that the restarted consumer's join does not
	// wait long for this dead member to be evicted.
	scfg.Consumer.Group.Session.Timeout = 6 * time.Second
	scfg.Consumer.Group.Heartbeat.Interval = time.Second

	var calls atomic.Int64
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if calls.Add(1) > int64(limit) {
			<-ctx.Done() // hold the transaction open until we are killed
			return ctx.Err()
		}
		return eff(ctx, m)
	})
	err = consumer.Run(ctx, testMode(os.Getenv(crashEnvMode)).apply(consumer.Config{
		Brokers:        strings.Split(os.Getenv(crashEnvBrokers), ","),
		Group:          os.Getenv(crashEnvGroup),
		Topics:         []string{os.Getenv(crashEnvTopic)},
		Dedupe:         dedupe.NewPostgres(pool),
		Sarama:         scfg,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
		CommitInterval: time.Hour, // never by the ticker: the kill comes first
	}), h)
	t.Fatalf("crash helper: Run returned %v before it was killed", err)
}

// crashAppName is the application_name of the crash helper's sessions.
func crashAppName(schema string) string { return "idem-crash-helper-" + schema }

// The consumer process dies (SIGKILL) after effects were committed in
// PostgreSQL but before their offsets were committed to Kafka. The restarted
// consumer gets those messages again; the inbox turns each into a duplicate, so
// every key ends with exactly one effect.
func TestCrashAfterCommitBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		const partitions, total, limit = 3, 600, 240
		e := newEnv(t, partitions).in(mode)
		e.produce(coreKeys("crash", total), partitions)

		child := e.startHelperProcess("TestCrashHelperProcess", crashEnvLimit+"="+strconv.Itoa(limit), crashEnvMode+"="+string(mode))

		// The helper commits exactly `limit` effects, then blocks. In batch and
		// lane modes a blocked message also holds back the uncommitted rest of
		// its batch, so fewer are committed: wait for some.
		want := limit
		if mode != "" {
			want = 1
		}
		testenv.Eventually(t, 90*time.Second, func() error {
			select {
			case <-child.Done():
				return nil // reported by Kill
			default:
			}
			if got := e.count(`SELECT count(*) FROM effects`); got < want {
				return fmt.Errorf("effects = %d, waiting for %d", got, want)
			}
			return nil
		})
		// SIGKILL: no deferred code, no revoke, no offset commit. It fails the
		// test if the helper ended before it was killed.
		child.Kill(t)

		// A COMMIT the helper sent just before the kill may still complete on the
		// server: count the effects only once its sessions have ended.
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = left($1, 63)`, crashAppName(e.coreSchema())); n > 0 {
				return fmt.Errorf("%d sessions of the killed helper still open", n)
			}
			return nil
		})
		atKill := e.count(`SELECT count(*) FROM effects`)
		if atKill > limit || (want == limit && atKill != limit) {
			t.Fatalf("after the kill, effects = %d, want %d (blocked transactions must roll back)", atKill, limit)
		}
		// The crash left effects whose offsets were never committed.
		committed := e.committed(e.topic, partitions)
		redelivered := 0
		for p := range int32(partitions) {
			c := max(committed[p], 0) // -1: nothing committed
			redelivered += e.count(`SELECT count(*) FROM effects WHERE part = $1 AND off >= $2`, p, c)
		}
		t.Logf("committed at the crash: %v; effects beyond the committed offsets: %d", committed, redelivered)
		if redelivered == 0 {
			t.Fatalf("every effect's offset was committed before the kill (committed %v): the crash window was not exercised", committed)
		}

		// Restart with an ordinary consumer.
		reg := prometheus.NewRegistry()
		cfg := e.config()
		cfg.Registerer = reg
		start(t, cfg, effectHandler())
		e.waitCommitted(e.topic, partitions, 120*time.Second)
		e.coreAssertOnePerKey(total)
		if dup := coreOutcome(t, reg, coremetrics.OutcomeDuplicate); dup < redelivered {
			t.Errorf("idem_messages_total{outcome=duplicate} = %d after the restart, want >= %d (redelivered messages whose effects were committed)", dup, redelivered)
		}
		if got := coreOutcome(t, reg, coremetrics.OutcomeProcessed); got != total-atKill {
			t.Errorf("idem_messages_total{outcome=processed} = %d after the restart, want %d", got, total-atKill)
		}
	})
}

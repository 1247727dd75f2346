package step_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// Environment of the crash child.
const (
	childBrokers = "IDEM_STEP_BROKERS"
	childDB      = "IDEM_STEP_DATABASE_URL"
	childGroup   = "IDEM_STEP_GROUP"
	childTopic   = "IDEM_STEP_TOPIC"
	childStage   = "IDEM_STEP_STAGE"
)

// TestStepCrashChild is not a test: the crash tests run the test binary
// again with only this function (testenv.StartChild) and SIGKILL it. It
// consumes the test's topic with the payments handler, which, at the stage
// IDEM_STEP_STAGE names, prints "BLOCKED <stage> <order>" and blocks (its
// transaction open) until the process dies. Outside that child it returns at
// once.
func TestStepCrashChild(t *testing.T) {
	if !testenv.InChild("TestStepCrashChild") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // the parent kills us long before
	defer cancel()
	pool, err := pgxpool.New(ctx, getenv(t, childDB))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	k := &idemtest.Kafka{Brokers: strings.Split(getenv(t, childBrokers), ",")}
	group, topic, stage := getenv(t, childGroup), getenv(t, childTopic), getenv(t, childStage)
	cfg := idemtest.WithPostgres(t, k.Config(t, group, topic), pool)
	cfg.Sarama.Consumer.Group.Session.Timeout = 6 * time.Second
	cfg.Sarama.Consumer.Group.Heartbeat.Interval = time.Second
	cfg.CommitInterval = time.Hour // no offset is committed before the kill
	h := payments(pool, func(ctx context.Context, at string, m *handler.Message) error {
		if at != stage {
			return nil
		}
		fmt.Printf("BLOCKED %s %s\n", at, m.Value)
		<-ctx.Done() // until we are killed
		return ctx.Err()
	})
	if err := consumer.Run(ctx, cfg, h); err != nil {
		t.Fatal(err)
	}
}

// startCrashChild starts the crash child on e, blocking at stage, and waits
// until it is blocked there on order.
func startCrashChild(t *testing.T, e *env, stage, order string) *testenv.Child {
	t.Helper()
	c := testenv.StartChild(t, "TestStepCrashChild",
		childBrokers+"="+strings.Join(e.kafka.Brokers, ","), childDB+"="+e.pg.URL,
		childGroup+"="+e.group, childTopic+"="+e.topic, childStage+"="+stage)
	want := "BLOCKED " + stage + " " + order
	if _, err := c.WaitForWithin(2*time.Minute, func(line string) bool { return strings.TrimSpace(line) == want }); err != nil {
		t.Fatalf("%v\n%s", err, c.Output())
	}
	return c
}

// SIGKILL after the step's fn returned and its row committed, before the
// handler's transaction commits: the message is handled again after the
// restart, and the step returns the recorded charge without calling the
// bank again.
func TestStepCrashAfterStepBeforeCommit(t *testing.T) {
	testenv.SkipIfShort(t)
	e := newEnv(t)
	e.produce(t, "order-1")
	c := startCrashChild(t, e, "after-step", "order-1")
	c.Kill(t)

	pool := e.pg.Pool
	if n := count(t, pool, `SELECT count(*) FROM idem_steps WHERE status = 'done'`); n != 1 {
		t.Fatalf("%d step rows after the kill, want 1 (the row commits before the handler goes on)", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM effects`); n != 0 {
		t.Fatalf("%d effects before the restart: the killed handler's transaction committed", n)
	}
	idemtest.Start(t, e.config(t), payments(pool, nil))
	waitCount(t, pool, 1, `SELECT count(*) FROM effects`)

	if n := count(t, pool, `SELECT count(*) FROM bank_requests`); n != 1 {
		t.Fatalf("the bank was called %d times, want once: the step ran again after the restart", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM effects e JOIN bank_charges b USING (charge_id)`); n != 1 {
		t.Fatal("the effect does not carry the recorded charge")
	}
}

// SIGKILL after the bank charged, inside the step, before the step's row
// commits: after the restart the step runs again, and the bank sees the
// same derived key twice and charges once.
func TestStepCrashAfterBankBeforeRecord(t *testing.T) {
	testenv.SkipIfShort(t)
	e := newEnv(t)
	e.produce(t, "order-1")
	c := startCrashChild(t, e, "after-bank", "order-1")
	c.Kill(t)

	pool := e.pg.Pool
	if n := count(t, pool, `SELECT count(*) FROM idem_steps`); n != 0 {
		t.Fatalf("%d step rows after a kill inside the step, want 0", n)
	}
	idemtest.Start(t, e.config(t), payments(pool, nil))
	waitCount(t, pool, 1, `SELECT count(*) FROM effects`)

	if n := count(t, pool, `SELECT count(*) FROM bank_requests`); n != 2 {
		t.Fatalf("the bank saw %d requests, want 2 (before and after the crash)", n)
	}
	if n := count(t, pool, `SELECT count(DISTINCT key) FROM bank_requests`); n != 1 {
		t.Fatalf("the bank saw %d keys, want one derived key, twice", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM bank_charges`); n != 1 {
		t.Fatalf("the bank charged %d times, want once", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM idem_steps WHERE status = 'done'`); n != 1 {
		t.Fatalf("%d step rows after the restart, want 1", n)
	}
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/recovery"
)

// TestHooksRunOncePerMessage is the hooks part of issue 21 test 6:
// OnDeadLettered writes its row in the inbox's transaction once per
// dead-lettered message (a fraud decline to its rule's DLQ, a permanent
// error, an expired message), Expiry.OnExpired once per expired one; when every
// message is delivered again (the group's offsets deleted, as a crash
// before the offset commit leaves them), the records go to the DLQs again
// (at least once) but no hook row is written twice.
func TestHooksRunOncePerMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := testenv.Context(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE attention(key text, kind text, dlq text); CREATE TABLE expired_rows(key text, dropped bool)`); err != nil {
		t.Fatal(err)
	}
	errFraud := errors.New("bank: fraud suspected")
	fraudDLQ := e.topic + ".dlq.fraud"
	t.Cleanup(func() { e.k.DeleteTopics(t, fraudDLQ) })
	now := time.Now()
	e.produceExpiry(expiryRec{ikey: "fraud"}, expiryRec{ikey: "bad"}, expiryRec{ikey: "old", ts: now.Add(-2 * time.Hour)}, expiryRec{ikey: "ok"})

	run := func() *running {
		cfg := e.config()
		cfg.Registerer = prometheus.NewRegistry()
		cfg.Retry.Rules = []recovery.Rule{{Name: "fraud", Match: recovery.Is(errFraud), Attempts: 1, Tiers: &recovery.Ladder{}, DLQ: fraudDLQ}}
		cfg.Expiry = consumer.Expiry{MaxAge: time.Hour}
		cfg.OnDeadLettered = func(ctx context.Context, d consumer.DeadLettered) error {
			_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO attention VALUES ($1, $2, $3)`, d.Message.IdempotencyKey, string(d.Kind), d.Topic)
			return err
		}
		cfg.Expiry.OnExpired = func(ctx context.Context, x consumer.Expired) error {
			_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO expired_rows VALUES ($1, $2)`, x.Message.IdempotencyKey, x.Dropped)
			return err
		}
		eff := effectHandler()
		return start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
			switch m.IdempotencyKey {
			case "fraud":
				return fmt.Errorf("charge: %w", errFraud)
			case "bad":
				return handler.Permanent(errors.New("amount must be positive"))
			}
			return eff(ctx, m)
		}))
	}
	check := func(round string) {
		t.Helper()
		for _, c := range []struct{ q, want string }{
			{`SELECT string_agg(key || '/' || kind || '/' || dlq, ',' ORDER BY key) FROM attention`,
				fmt.Sprintf("bad/permanent/%s,fraud/retriable/%s,old/expired/%s", e.dlq(), fraudDLQ, e.dlq())},
			{`SELECT string_agg(key || '/' || dropped, ',') FROM expired_rows`, "old/false"},
			{`SELECT string_agg(key, ',') FROM effects`, "ok"},
		} {
			var got string
			if err := e.query.QueryRow(ctx, c.q).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Errorf("%s: %s = %q, want %q", round, c.q, got, c.want)
			}
		}
	}
	r := run()
	e.waitCommitted(e.topic, 1, 60*time.Second)
	check("first delivery")
	if err := r.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}

	// Deliver everything again.
	if err := e.k.Admin(t).DeleteConsumerGroupOffset(e.group, e.topic, 0); err != nil {
		t.Fatal(err)
	}
	run()
	testenv.Eventually(t, 60*time.Second, func() error {
		if n, f := e.total(e.dlq(), 1), e.total(fraudDLQ, 1); n != 4 || f != 2 {
			return fmt.Errorf("DLQ %d records, fraud DLQ %d; want 4 and 2 (each dead-lettered again)", n, f)
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 60*time.Second)
	check("second delivery")
}

// hooksConfig is the consumer of the hooks crash test: every message whose
// idempotency key starts with "bad" is permanent, and OnDeadLettered writes
// an attention row in the inbox's transaction.
func hooksConfig(cfg consumer.Config) (consumer.Config, handler.Handler) {
	cfg.OnDeadLettered = func(ctx context.Context, d consumer.DeadLettered) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO attention VALUES ($1, $2, $3)`, d.Message.IdempotencyKey, string(d.Kind), d.Topic)
		return err
	}
	eff := effectHandler()
	return cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		if len(m.IdempotencyKey) >= 3 && m.IdempotencyKey[:3] == "bad" {
			return handler.Permanent(errors.New("rejected"))
		}
		return eff(ctx, m)
	})
}

// TestHooksHelperProcess is not a test: TestHooksSIGKILLOncePerMessage runs
// the test binary again with only this function (startHelperProcess), and
// SIGKILLs it. It consumes with hooksConfig and a one-hour CommitInterval,
// so no offset is committed before the kill. Outside that child it returns
// at once.
func TestHooksHelperProcess(t *testing.T) {
	if !testenv.InChild("TestHooksHelperProcess") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // the parent kills us long before
	defer cancel()
	base, _ := helperConfig(t, ctx, "idem-hooks-helper")
	base.CommitInterval = time.Hour // never by the ticker: the kill comes first
	cfg, h := hooksConfig(base)
	err := consumer.Run(ctx, cfg, h)
	t.Fatalf("hooks helper: Run returned %v before it was killed", err)
}

// TestHooksSIGKILLOncePerMessage is the crash part of issue 21 test 6: a
// consumer dead-letters 50 messages, runs OnDeadLettered for each, and is
// SIGKILLed before any offset is committed; the consumer started after it
// gets every message again and dead-letters it again, but OnDeadLettered
// has written exactly one row per message.
func TestHooksSIGKILLOncePerMessage(t *testing.T) {
	t.Parallel()
	const n = 50
	e := newEnv(t, 1)
	ctx := testenv.Context(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE attention(key text, kind text, dlq text)`); err != nil {
		t.Fatal(err)
	}
	e.produce(coreKeys("bad", n), 1)

	child := e.startHelperProcess("TestHooksHelperProcess")
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := e.count(`SELECT count(*) FROM attention`); got != n {
			return fmt.Errorf("%d of %d hook rows", got, n)
		}
		return nil
	})
	child.Kill(t) // fails the test if the helper ended before it was killed
	if c := e.committed(e.topic, 1)[0]; c > 0 {
		t.Fatalf("offset %d committed before the kill: the crash window was not exercised", c)
	}

	cfg, h := hooksConfig(e.config())
	start(t, cfg, h)
	e.waitCommitted(e.topic, 1, 90*time.Second)
	if got := e.total(e.dlq(), 1); got < 2*n {
		t.Errorf("DLQ holds %d records, want %d (each dead-lettered again after the crash)", got, 2*n)
	}
	if got := e.count(`SELECT count(*) FROM attention`); got != n {
		t.Errorf("%d hook rows, want %d", got, n)
	}
	if got := e.count(`SELECT count(DISTINCT key) FROM attention`); got != n {
		t.Errorf("%d distinct keys in the hook rows, want %d", got, n)
	}
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// TestRulesRouteByError is issue 21 test 6 without the hooks, on real Kafka
// and PostgreSQL: a fraud decline goes straight to a dead-letter topic of its
// own; a timeout gets 5 attempts a delivery and two tiers of its own ladder;
// a validation error (HTTP 422) goes to the DLQ at once; any other error
// keeps the fallback (Retry.Attempts 2, one tier).
func TestRulesRouteByError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	errFraud := errors.New("bank: fraud suspected")
	fraudDLQ := e.topic + ".dlq.fraud"
	slow := func(n int) string { return fmt.Sprintf("%s.%s.retry.slow.%d", e.topic, e.group, n) }
	t.Cleanup(func() { e.k.DeleteTopics(t, fraudDLQ, slow(1), slow(2)) })

	cfg := e.config()
	cfg.Retry.Attempts = 2
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{100 * time.Millisecond}}
	cfg.Retry.Rules = []recovery.Rule{
		{Name: "fraud", Match: recovery.Is(errFraud), Attempts: 1, Tiers: &recovery.Ladder{}, DLQ: fraudDLQ},
		{Name: "timeout", Match: recovery.Kind(handler.KindTimeout), Attempts: 5,
			Tiers: &recovery.Ladder{Name: "slow", Delays: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}}},
		{Name: "validation", Match: recovery.HTTPStatus(400, 422), Attempts: 1, Tiers: &recovery.Ladder{}},
	}
	var c calls
	eff := effectHandler()
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		c.inc(m.IdempotencyKey)
		switch m.IdempotencyKey {
		case "fraud":
			return fmt.Errorf("charge: %w", errFraud)
		case "timeout":
			return fmt.Errorf("charge: %w", handler.ErrTimeout)
		case "validation":
			return handler.HTTPStatus(errors.New("amount must be positive"), 422)
		case "other":
			return errors.New("bank: 500")
		}
		return eff(ctx, m)
	}))
	e.produce([]string{"fraud", "timeout", "validation", "other", "ok"}, 1)
	e.waitCommitted(e.topic, 1, 60*time.Second)

	// The default DLQ gets timeout (after its ladder), validation and other.
	kinds := e.dlqKinds(3)
	for k, kind := range map[string]string{"timeout": "timeout", "validation": "retriable", "other": "retriable"} {
		if kinds[k] != kind {
			t.Errorf("default DLQ: %s has kind %q, want %q (all: %v)", k, kinds[k], kind, kinds)
		}
	}
	fraud := e.coreReadRecords(fraudDLQ, 0, 1, 30*time.Second)
	if string(fraud[0].Key) != "fraud" || header(fraud[0], wire.HeaderOriginalTopic) != e.topic {
		t.Errorf("fraud DLQ record: key %q, original topic %q", fraud[0].Key, header(fraud[0], wire.HeaderOriginalTopic))
	}
	for topic, want := range map[string]int64{e.dlq(): 3, fraudDLQ: 1, e.tier(1): 1, slow(1): 1, slow(2): 1} {
		if n := e.total(topic, 1); n != want {
			t.Errorf("%s holds %d records, want %d", topic, n, want)
		}
	}
	for k, want := range map[string]int{
		"fraud":      1,           // straight to its DLQ
		"timeout":    5 * 3,       // 5 attempts at the source and in each of its two tiers
		"validation": 1,           // at once
		"other":      (1 + 1) * 2, // the fallback: Retry.Attempts, at the source and in its one tier
		"ok":         1,
	} {
		if n := c.get(k); n != want {
			t.Errorf("handler called %d times for %s, want %d", n, k, want)
		}
	}
	if n := e.count(`SELECT count(*) FROM effects`); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
}

// TestRulesRejectedAtStart: a rule with no match function, or negative
// attempts, is a start error naming the rule (issue 21 test 7).
func TestRulesRejectedAtStart(t *testing.T) {
	for name, tc := range map[string]struct {
		rule recovery.Rule
		want string
	}{
		"no match":          {recovery.Rule{Name: "fraud", DLQ: "payments.dlq.fraud"}, `rule 0 ("fraud"): Match has no matcher`},
		"negative attempts": {recovery.Rule{Name: "x", Match: recovery.Kind(handler.KindTimeout), Attempts: -1}, "Attempts = -1"},
		"ladder no name":    {recovery.Rule{Match: recovery.Kind(handler.KindTimeout), Tiers: &recovery.Ladder{Delays: []time.Duration{time.Second}}}, "no Name"},
	} {
		cfg := coreValidConfig()
		cfg.Retry.Rules = []recovery.Rule{tc.rule}
		err := consumer.Run(context.Background(), cfg, handler.Func(func(context.Context, *handler.Message) error { return nil }))
		if !slices.Contains(coreConfigFields(err), "Retry.Rules") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Run = %v, want a problem of Retry.Rules saying %q", name, err, tc.want)
		}
	}
	cfg := coreValidConfig()
	cfg.Ordering = consumer.ByKey(nil)
	cfg.Retry.Rules = []recovery.Rule{{Match: recovery.Kind(handler.KindTimeout), Tiers: &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Second}}}}
	if !strings.Contains(fmt.Sprint(cfg.Validate()), "not supported with Ordering ByKey") {
		t.Errorf("Validate = %v, want a rule ladder refused with Ordering ByKey", cfg.Validate())
	}
}

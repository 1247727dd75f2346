package recovery_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

func ExampleNew() {
	errFraud := errors.New("bank: fraud suspected")
	policy, err := recovery.New(
		// Today's behaviour, from the consumer's Config.Retry: Attempts 4,
		// Backoff {100ms, 5s}, two retry tiers.
		recovery.Fallback{
			Attempts: 1 + 3,
			Backoff:  recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second},
			Retry:    retrytopic.Policy{Delays: []time.Duration{time.Second, time.Minute}},
		},
		// A fraud decline goes straight to a dead-letter topic of its own.
		recovery.Rule{Name: "fraud", Match: recovery.Is(errFraud), Attempts: 1, Tiers: &recovery.Ladder{}, DLQ: "payments.dlq.fraud"},
		// Timeouts get more patience: 5 attempts a delivery, two slow tiers.
		recovery.Rule{Name: "timeout", Match: recovery.Kind(handler.KindTimeout), Attempts: 5,
			Tiers: &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Minute, 10 * time.Minute}}},
		// A validation error (HTTP 400 or 422 from the bank) is dead-lettered at once.
		recovery.Rule{Name: "validation", Match: recovery.HTTPStatus(400, 422), Attempts: 1, Tiers: &recovery.Ladder{}},
	)
	if err != nil {
		panic(err)
	}
	for _, err := range []error{
		fmt.Errorf("charge p-1: %w", errFraud),
		fmt.Errorf("charge p-2: %w", handler.ErrTimeout),
		handler.HTTPStatus(errors.New("amount must be positive"), 422),
		errors.New("bank: 500"),
	} {
		d := policy.Decide(err)
		dest, tier, delay := d.Retry.Next("payments", "billing", 0)
		fmt.Printf("%-10s %d attempts, then %s (tier %d, %s)\n", d.Name, d.Attempts, dest, tier, delay)
	}
	// Output:
	// fraud      1 attempts, then payments.dlq.fraud (tier 0, 0s)
	// timeout    5 attempts, then payments.billing.retry.slow.1 (tier 1, 1m0s)
	// validation 1 attempts, then payments.billing.dlq (tier 0, 0s)
	// default    4 attempts, then payments.billing.retry.1 (tier 1, 1s)
}

func ExampleNew_invalid() {
	_, err := recovery.New(
		recovery.Fallback{Attempts: 4, Backoff: recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}},
		recovery.Rule{Name: "fraud", DLQ: "payments.dlq.fraud"},
		recovery.Rule{Match: recovery.SQLState("4"), Attempts: -1},
	)
	fmt.Println(err)
	// Output:
	// recovery: invalid policy: rule 0 ("fraud"): Match has no matcher (Match is the zero Matcher): use recovery.Is, As, Kind, SQLState, HTTPStatus or Func
	// recovery: invalid policy: rule 1: Match SQLState(4): "4" is neither a class (2 characters, e.g. "23") nor a code (5, e.g. "23505")
	// recovery: invalid policy: rule 1: Attempts = -1, must be >= 1 (or 0: the fallback's, 4)
}

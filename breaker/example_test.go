package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
)

func ExampleSet_Do() {
	// A manual clock keeps the output stable; real code leaves Now unset.
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	set, err := breaker.NewSet(breaker.Settings{
		ConsecutiveFailures: 2,
		OpenTimeout:         30 * time.Second,
		Now:                 func() time.Time { return now },
		OnStateChange: func(name string, from, to breaker.State) {
			if from == to {
				return // a new breaker's announcement, before its first transition
			}
			fmt.Printf("  [%s: %s -> %s]\n", name, from, to)
		},
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	bankDown := func(ctx context.Context) error { return errors.New("bank: 503") }
	bankUp := func(ctx context.Context) error { return nil }

	call := func(fn func(context.Context) error) {
		err := set.Do(ctx, "bank-api", fn)
		d, open := breaker.RetryAfter(err)
		switch {
		case breaker.Rejected(err):
			fmt.Println("not called, pause for", d) // the consumer pauses its partitions
		case open:
			fmt.Println("called, and this failure opened the breaker: pause for", d)
		default:
			fmt.Println("called:", err)
		}
	}
	call(bankDown)
	call(bankDown) // the second failure in a row opens the breaker
	call(bankUp)   // rejected without calling the bank
	now = now.Add(10 * time.Second)
	call(bankUp)
	now = now.Add(20 * time.Second) // the cool-down is over
	call(bankUp)                    // the half-open probe; its success closes the breaker
	fmt.Println(set.States())
	// Output:
	// called: bank: 503
	//   [bank-api: closed -> open]
	// called, and this failure opened the breaker: pause for 30s
	// not called, pause for 30s
	// not called, pause for 20s
	//   [bank-api: open -> half-open]
	//   [bank-api: half-open -> closed]
	// called: <nil>
	// map[bank-api:closed]
}

func ExampleSet_SetLimits() {
	// A manual clock keeps the output stable; real code leaves Now unset.
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	set, err := breaker.NewSet(breaker.Settings{Now: func() time.Time { return now }})
	if err != nil {
		panic(err)
	}
	// The bank's quota for the whole consumer group: 36 calls a minute, 3 at
	// once. Calls wait up to Limits.MaxWait (default 1s) for a token or slot.
	if err := set.SetLimits("bank", breaker.Limits{Rate: 0.6, Burst: 3, MaxInFlight: 3}); err != nil {
		panic(err)
	}
	// On each rebalance the consumer gives this member its share: 1 of 3.
	if err := set.SetShare(1.0 / 3); err != nil {
		panic(err)
	}
	st := set.LimitStates()["bank"]
	fmt.Printf("this member: %.1f calls/s, burst %d, %d in flight\n", st.Rate, st.Burst, st.MaxInFlight)

	ctx := context.Background()
	quotaLeft := true
	bank := func(ctx context.Context) error {
		if !quotaLeft { // the bank answers 429 with Retry-After: 2
			return handler.RetryAfter(errors.New("bank: HTTP 429"), 2*time.Second)
		}
		return nil
	}
	call := func() {
		err := set.Do(ctx, "bank", bank)
		var te *breaker.ThrottleError
		d, pause := breaker.RetryAfter(err) // what the consumer pauses for
		switch {
		case errors.As(err, &te) && breaker.Rejected(err):
			fmt.Printf("not called (%s): pause for %s\n", te.Reason, d)
		case pause:
			fmt.Println("called, the bank asked for a pause:", d)
		default:
			fmt.Println("called:", err)
		}
	}
	call() // the bucket's one token
	call() // the next comes in 5s, longer than MaxWait: no wait, pause instead
	now = now.Add(5 * time.Second)
	call()
	now = now.Add(5 * time.Second)
	quotaLeft = false
	call() // a 429: not a breaker failure, and no retry spent
	now = now.Add(500 * time.Millisecond)
	call() // paused: the bank is not called
	st = set.LimitStates()["bank"]
	fmt.Println("throttled calls:", st.Throttled, "paused so far:", st.Paused)
	fmt.Println(set.States())
	// Output:
	// this member: 0.2 calls/s, burst 1, 1 in flight
	// called: <nil>
	// not called (rate): pause for 5s
	// called: <nil>
	// called, the bank asked for a pause: 2s
	// not called (retry-after): pause for 1.5s
	// throttled calls: map[rate:1 retry-after:2] paused so far: 500ms
	// map[bank:closed]
}

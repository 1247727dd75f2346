package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/breaker"
)

func ExampleSet_Do() {
	// A manual clock keeps the output stable; real code leaves Now unset.
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	set, err := breaker.NewSet(breaker.Settings{
		ConsecutiveFailures: 2,
		OpenTimeout:         30 * time.Second,
		Now:                 func() time.Time { return now },
		OnStateChange: func(name string, from, to breaker.State) {
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

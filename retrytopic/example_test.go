package retrytopic_test

import (
	"fmt"
	"time"

	"github.com/idemhq/idem/retrytopic"
)

func ExamplePolicy_Next() {
	pol := retrytopic.Policy{Delays: []time.Duration{time.Second, time.Minute}}
	for tier := 0; tier <= 2; tier++ {
		dest, next, delay := pol.Next("payments", "billing", tier)
		fmt.Println(tier, "->", dest, next, delay)
	}
	// Output:
	// 0 -> payments.billing.retry.1 1 1s
	// 1 -> payments.billing.retry.2 2 1m0s
	// 2 -> payments.billing.dlq 0 0s
}

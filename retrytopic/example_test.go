package retrytopic_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
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

func ExampleEncode() {
	orig := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("pay-42")}}
	now := time.UnixMilli(1_700_000_000_000)
	f := retrytopic.NewFailure(handler.Permanent(errors.New("card declined")),
		retrytopic.Source{Topic: "payments", Partition: 3, Offset: 9, Group: "billing"}, retrytopic.Failure{}, now)
	for _, h := range retrytopic.Encode(orig, f) {
		fmt.Printf("%s=%s\n", h.Key, h.Value)
	}
	back, _, _ := retrytopic.Decode(retrytopic.Encode(orig, f))
	fmt.Println(back.Kind, back.OriginalTopic, back.OriginalOffset)
	// Output:
	// idempotency-key=pay-42
	// idem-attempt=1
	// idem-tier=0
	// idem-original-topic=payments
	// idem-original-partition=3
	// idem-original-offset=9
	// idem-consumer-group=billing
	// idem-error=card declined
	// idem-error-kind=permanent
	// idem-error-type=*errors.errorString
	// idem-first-failure-at=1700000000000
	// idem-last-failure-at=1700000000000
	// permanent payments 9
}

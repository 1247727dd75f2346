package wire_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

func ExampleEncode() {
	orig := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("pay-42")}}
	now := time.UnixMilli(1_700_000_000_000)
	f := wire.NewFailure(handler.Permanent(errors.New("card declined")),
		wire.Source{Topic: "payments", Partition: 3, Offset: 9, Group: "billing"}, retrytopic.Failure{}, now)
	for _, h := range wire.Encode(orig, f) {
		fmt.Printf("%s=%s\n", h.Key, h.Value)
	}
	back, _, _ := wire.Decode(wire.Encode(orig, f))
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

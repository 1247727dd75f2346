package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
)

// BreakerMetrics returns the hook and an error; wire the hook into the
// breaker set the handler uses, on the registry given to Config.Registerer.
func ExampleBreakerMetrics() {
	reg := prometheus.NewRegistry()
	onChange, err := consumer.BreakerMetrics(reg)
	if err != nil {
		log.Fatal(err)
	}
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OnStateChange: onChange})
	if err != nil {
		log.Fatal(err)
	}
	_ = set.Do(context.Background(), "bank-api", func(context.Context) error { return errors.New("503") })

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "idem_breaker_state" {
			fmt.Println("idem_breaker_state{name=\"bank-api\"} =", mf.GetMetric()[0].GetGauge().GetValue())
		}
	}
	// Output: idem_breaker_state{name="bank-api"} = 2
}

// JSONField reads the idempotency key from the record value; numbers keep
// their JSON text. An error sends the message to the MissingKey policy.
func ExampleJSONField() {
	key := consumer.JSONField("meta.event_id")
	for _, v := range []string{`{"meta":{"event_id":"evt-7"}}`, `{"meta":{"event_id":42}}`, `{"meta":{}}`} {
		k, err := key(&handler.Message{Value: []byte(v)})
		fmt.Printf("%q %v\n", k, err)
	}
	// Output:
	// "evt-7" <nil>
	// "42" <nil>
	// "" JSONField("meta.event_id"): no field "meta.event_id"
}

// FirstOf tries extractors in order: here the header, then the JSON body.
func ExampleFirstOf() {
	key := consumer.FirstOf(consumer.HeaderKey("idempotency-key"), consumer.JSONField("id"))
	fromHeader := &handler.Message{Headers: []handler.Header{{Key: "idempotency-key", Value: []byte("h-1")}}, Value: []byte(`{"id":"j-1"}`)}
	fromBody := &handler.Message{Value: []byte(`{"id":"j-2"}`)}
	for _, m := range []*handler.Message{fromHeader, fromBody} {
		k, _ := key(m)
		fmt.Println(k)
	}
	fmt.Println(key)
	// Output:
	// h-1
	// j-2
	// consumer.FirstOf
}

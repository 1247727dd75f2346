package idemtest_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
)

// testOrders is a service's handler test, end to end on the in-process
// cluster: a duplicate delivery is handled once and a poison record is
// dead-lettered. In a service it is `func TestOrders(t *testing.T)`;
// TestExampleOrders runs it here.
func testOrders(t *testing.T) {
	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "orders", 1)
	k.Produce(t, "orders",
		idemtest.Record{IdempotencyKey: "o-1", Value: []byte(`{"id":"o-1","qty":2}`)},
		idemtest.Record{IdempotencyKey: "o-1", Value: []byte(`{"id":"o-1","qty":2}`)}, // a duplicate
		idemtest.Record{IdempotencyKey: "o-2", Value: []byte(`not json`)},             // poison
	)
	var shipped atomic.Int64
	c := idemtest.Start(t, k.Config(t, "shipping", "orders"), handler.Func(func(ctx context.Context, m *handler.Message) error {
		var o struct{ ID string }
		if err := json.Unmarshal(m.Value, &o); err != nil {
			return handler.Decode(err)
		}
		shipped.Add(1)
		return nil
	}))
	c.WaitHandled(t, 3) // processed, duplicate, dead-lettered
	if n := shipped.Load(); n != 1 {
		t.Fatalf("shipped %d times, want 1", n)
	}
	dl := k.ReadDLQ(t, idemtest.DLQTopic("orders", "shipping"), 1)
	if dl[0].Failure.Kind != handler.KindDecode {
		t.Fatalf("dead-lettered as %s", dl[0].Failure.Kind)
	}
}

// A handler test on the in-process cluster (see testOrders for the code,
// which a service writes as func TestOrders(t *testing.T)).
func Example() {
	_ = testOrders
}

package idemtest_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/retrytopic"
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
	dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ("orders", "shipping"), 1)
	if dl[0].Failure.Kind != handler.KindDecode {
		t.Fatalf("dead-lettered as %s", dl[0].Failure.Kind)
	}
}

// A handler test on the in-process cluster (see testOrders for the code,
// which a service writes as func TestOrders(t *testing.T)).
func Example() {
	_ = testOrders
}

// testShipments is a service's handler test that runs unchanged on the
// in-process cluster or on a real broker (KAFKA_BROKERS), with the inbox and
// the handler's table in a PostgreSQL schema of the test's own. In a service
// it is `func TestShipments(t *testing.T)`; TestExampleConnect runs it here.
func testShipments(t *testing.T) {
	k := idemtest.Connect(t)
	topic := k.Topic(t, "orders", 1)  // orders_<random>, deleted with its retry and DLQ topics
	group := k.Group(t, "shipping")   // shipping_<random>
	db := idemtest.ConnectPostgres(t) // a schema of its own, idem's tables in it
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE shipments (order_id text PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	k.Produce(t, topic,
		idemtest.Record{IdempotencyKey: "o-1", Value: []byte(`{"id":"o-1"}`)},
		idemtest.Record{IdempotencyKey: "o-1", Value: []byte(`{"id":"o-1"}`)}, // redelivered
		idemtest.Record{IdempotencyKey: "o-2", Value: []byte(`{"id":"o-2"}`)},
	)
	cfg := idemtest.WithPostgres(t, k.Config(t, group, topic), db.Pool)
	c := idemtest.Start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO shipments VALUES ($1)`, m.IdempotencyKey)
		return err // in the same transaction as the inbox row
	}))
	c.WaitHandled(t, 3)
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM shipments`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d shipments (err %v), want 2", n, err)
	}
}

// A handler test that runs on whichever Kafka the environment names (see
// testShipments for the code, which a service writes as
// func TestShipments(t *testing.T)).
func ExampleConnect() {
	_ = testShipments
}

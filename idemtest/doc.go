// Package idemtest runs idem end to end inside `go test`: an in-process
// Kafka cluster (franz-go's kfake, no Docker, no ports), helpers to create
// topics and produce records, consumer.Run in the background with a memory
// or PostgreSQL dedupe store, waits until the group has handled N records,
// and a reader for the dead-letter topic. A handler test then exercises the
// real pipeline — key extraction, the inbox, in-process retries, retry
// tiers, the dead-letter topic — rather than a fake pgx.Tx.
//
// A test of an order handler (the complete code is the package's Example):
//
//	func TestOrders(t *testing.T) {
//		k := idemtest.NewKafka(t)
//		k.CreateTopic(t, "orders", 1)
//		k.Produce(t, "orders",
//			idemtest.Record{IdempotencyKey: "o-1", Value: []byte(`{"id":"o-1","qty":2}`)},
//			idemtest.Record{IdempotencyKey: "o-1", Value: []byte(`{"id":"o-1","qty":2}`)}, // a duplicate
//			idemtest.Record{IdempotencyKey: "o-2", Value: []byte(`not json`)},             // poison
//		)
//		var shipped atomic.Int64
//		c := idemtest.Start(t, k.Config(t, "shipping", "orders"), handler.Func(func(ctx context.Context, m *handler.Message) error {
//			var o struct{ ID string }
//			if err := json.Unmarshal(m.Value, &o); err != nil {
//				return handler.Decode(err)
//			}
//			shipped.Add(1)
//			return nil
//		}))
//		c.WaitHandled(t, 3) // processed, duplicate, dead-lettered
//		if n := shipped.Load(); n != 1 {
//			t.Fatalf("shipped %d times, want 1", n)
//		}
//		dl := k.ReadDLQ(t, idemtest.DLQTopic("orders", "shipping"), 1)
//		if dl[0].Failure.Kind != handler.KindDecode {
//			t.Fatalf("dead-lettered as %s", dl[0].Failure.Kind)
//		}
//	}
//
// With PostgreSQL, [WithPostgres] creates idem's tables (consumer.Migrate)
// and switches the config to the transactional inbox, so the handler writes
// through dedupe.Tx(ctx) as in production:
//
//	k := idemtest.NewKafka(t)
//	cfg := idemtest.WithPostgres(t, k.Config(t, "shipping", "orders"), pool)
//
// Every helper takes a testing.TB, fails the test itself, and registers its
// cleanup with tb.Cleanup: the cluster is shut down and the consumer stopped
// (its error reported) when the test ends. Each [NewKafka] is a cluster of
// its own, so tests may run in parallel. Waits poll with a deadline
// ([DefaultTimeout]); nothing sleeps for a fixed time.
//
// The in-process cluster implements the Kafka protocol but is not Kafka:
// use it to test your handlers and wiring, and a real broker for load,
// broker configuration and failure drills.
package idemtest

// Package idemtest runs idem end to end inside `go test`: an in-process
// Kafka cluster (franz-go's kfake, no Docker, no ports) or the real broker
// the environment names, a PostgreSQL schema per test, helpers to create
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
//		dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ("orders", "shipping"), 1)
//		if dl[0].Failure.Kind != handler.KindDecode {
//			t.Fatalf("dead-lettered as %s", dl[0].Failure.Kind)
//		}
//	}
//
// With PostgreSQL, [WithPostgres] creates idem's tables (as idem.Migrate does)
// and switches the config to the transactional inbox, so the handler writes
// through dedupe.Tx(ctx) as in production:
//
//	k := idemtest.NewKafka(t)
//	cfg := idemtest.WithPostgres(t, k.Config(t, "shipping", "orders"), pool)
//
// # One test, either broker, a database of its own
//
// [Connect] gives the test the real broker named by KAFKA_BROKERS when it is
// set, and otherwise an in-process cluster (IDEM_REQUIRE_REAL_KAFKA=1 makes
// that a failure, for CI). A real broker is shared by every test and every
// run, so such a test takes its names from [Kafka.Topic] and [Kafka.Group]:
// unique, and deleted when the test ends, with the retry tiers and the
// dead-letter topic. [ConnectPostgres] gives it a PostgreSQL schema of its
// own on DATABASE_URL, with idem's tables, dropped when the test ends (the
// complete code is ExampleConnect's):
//
//	k := idemtest.Connect(t)
//	topic, group := k.Topic(t, "orders", 1), k.Group(t, "shipping")
//	db := idemtest.ConnectPostgres(t)
//	cfg := idemtest.WithPostgres(t, k.Config(t, group, topic), db.Pool)
//
// `make services` starts the broker and PostgreSQL and writes both
// variables to .state/services.env.
//
// Every helper takes a testing.TB, fails the test itself, and registers its
// cleanup with tb.Cleanup: the cluster is shut down, the consumer stopped
// (its error reported), topics and schemas removed when the test ends. Each
// [NewKafka] is a cluster of its own and [Connect]'s names and schemas are
// unique, so tests may run in parallel. Waits poll with a deadline (30 s,
// or Eventually's timeout); nothing sleeps for a fixed time.
//
// The in-process cluster implements the Kafka protocol but is not Kafka:
// use it to test your handlers and wiring, and a real broker for load,
// broker configuration and failure drills.
package idemtest

// Package outbox is idem's transactional outbox: a handler's database writes
// and the events they imply commit in one transaction, or neither does, and a
// relay publishes the committed events to Kafka.
//
// Publishing from a handler straight to Kafka is the pitfall this removes: an
// event sent before the transaction commits is out in the world even if the
// transaction then rolls back, and a message redelivered after a crash sends
// it again. With the outbox the event is a row, and the service runs the
// relay next to its consumer, as it runs metrics.Serve:
//
//	relay := &outbox.Relay{Pool: pool, Brokers: brokers, Health: new(outbox.Health)}
//	go func() {
//		if err := relay.Run(ctx); err != nil { // until ctx ends
//			slog.Error("outbox relay stopped", "err", err)
//		}
//	}()
//	err := consumer.Run(ctx, consumer.Config{
//		Brokers: brokers, Group: "payments", Topics: []string{"payments"},
//		Dedupe:  dedupe.NewPostgres(pool),
//	}, handler.Func(func(ctx context.Context, m *handler.Message) error {
//		tx := dedupe.Tx(ctx) // the transaction of the inbox row
//		if _, err := tx.Exec(ctx, `INSERT INTO payments ...`); err != nil {
//			return err
//		}
//		return outbox.Enqueue(ctx, tx, outbox.Message{
//			Topic: "payments.events", Key: []byte(orderID), Value: event,
//		})
//	}))
//
// A duplicate delivery never reaches the handler, so it enqueues nothing; a
// failing handler rolls its events back with everything else.
//
// # Guarantee
//
// At-least-once publish: a committed row is published until Kafka
// acknowledges it, and only then deleted. A relay that dies between the ack
// and the delete leaves the row, and the next leader publishes it again with
// the same idem-outbox-id header. Because that id is also the record's
// idempotency-key header (unless the message sets its own), an idem consumer
// downstream applies the event exactly once with no extra code.
//
// # Exactly once
//
// Readers that are not idem consumers (ledgers, analytics, partner feeds,
// Kafka Streams) count a re-sent event twice. For them, set
// Relay.ExactlyOnce (`idem outbox relay --exactly-once`): each round of rows
// is first recorded under a new round number in the database, then published
// in a Kafka transaction that also commits that number as the relay's
// progress mark (an offset of the group Relay.TransactionalID), then deleted.
// A new leader first fences the old one's producer (same transactional.id),
// then reads the mark: the rows of the round it names committed and are
// deleted without being sent again; every other row is published by a later
// round.
// A read_committed reader then sees each row exactly once whatever the
// relay was doing when it died. It costs throughput and latency (one Kafka
// transaction and one more statement per round); Relay's doc, "Exactly
// once", has the argument, the failure handling and the figures.
//
// # Delayed events
//
// Message.NotBefore (zero by default: as soon as possible) keeps a row
// unpublished until that time by the database clock, for hours or days if
// need be, without holding anything but the later rows of its key: a key's
// rows are still published in enqueue order. The relay arms a timer for the
// earliest due row (capped by Relay.PollInterval) in addition to NOTIFY, so
// it neither polls nor publishes late. Relay's doc, "Delayed rows", has the
// details.
//
// # Traces and correlation
//
// Enqueue stores the trace context of its ctx (inside an idem handler, the
// message's idem.handle span) and its correlation id (in an idem handler,
// the consumed message's, or WithCorrelationID's) as headers of each event. The relay publishes
// the event in an "idem.outbox.publish" span, a child of that context and
// linked to it, and the record carries the span's context, so the handler,
// the publish and the next consumer are one trace (Relay.TracerProvider,
// Relay.Propagator). docs/outbox.md also shows OpenTelemetry metrics
// through the Prometheus bridge.
//
// # Relay
//
// Relay runs as a library type (Relay.Run: in the consumer's process, next
// to consumer.Run, or in a process of its own) or as `idem outbox relay`.
// Its readiness is Health.Err: a service that runs one makes its /readyz
// check it after consumer.Readiness.Check, so that a relay that cannot run
// makes the service not ready (the events its handlers enqueue would pile up
// unseen); examples/payments-consumer does. Run as many as you like: an advisory
// lock lets one publish per table and the others take over within seconds.
// See Relay for leadership, ordering, the late-commit argument, bad input and
// the failed state; `idem outbox list` and `idem outbox retry` show the rows
// and make failed ones pending again.
//
// # Table
//
// idem_outbox (or Relay.Table) is created by idem.Migrate,
// `idem migrate` or Relay.Run: id (bigint identity, the order), event_id
// (uuid, published as idem-outbox-id), topic, key, value, header_keys,
// header_values, created_at, not_before, state (pending, published, failed), attempts,
// rejections, last_error, retry_at, published_at, key_id and sealed (the
// value and headers sealed at rest by Relay.Enqueue with
// Relay.EncryptionKeyFile; docs/outbox.md, "Encrypted at rest"); and <table>_rounds
// (round, ids), the rounds of the exactly-once relay. An AFTER INSERT
// trigger NOTIFYs the relay at commit.
//
// # Metrics
//
// idem_outbox_pending, idem_outbox_oldest_pending_seconds, idem_outbox_failed,
// idem_outbox_published_total, idem_outbox_publish_seconds,
// idem_outbox_publish_failures_total{reason} and idem_outbox_leader, all
// labelled by table (package metrics lists them).
package outbox

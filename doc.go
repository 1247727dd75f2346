// Package idem makes Kafka consumption safe to retry: a Go service consumes
// a topic with package consumer, writes its handler against package handler,
// and every message goes through an idempotency inbox in PostgreSQL in the
// same transaction as the handler's writes. Failures are retried in process,
// then through retry topics, then dead-lettered with their whole story; an
// offset is committed only once the message's outcome is durable. At-least-once
// delivery and an idempotent consumer give effectively-once effects.
//
// This package is the composition root: it holds what spans every
// component ([Migrate], the one migration entry point) and this map. No
// other package of idem imports it.
//
// # The story of one message
//
// consumer.Run claims partitions of a consumer group and hands each record
// to the handler as a handler.Message. Before the handler runs, the record's
// idempotency key (consumer.Config.KeyFunc) is inserted into the inbox
// (dedupe.NewPostgres) in a transaction the handler writes through
// (dedupe.Tx); a key already there makes the record a duplicate, skipped.
// The handler's result decides the rest (handler's doc): nil commits; a
// retriable error is retried in process, then forwarded to the retry tiers
// and finally the dead-letter topic (retrytopic; per-error rules in
// recovery); handler.Permanent and handler.Decode go to the dead-letter
// topic at once; an open breaker (breaker) pauses consumption instead of
// spending retries. Events the handler emits go through the transactional
// outbox (outbox) in the same transaction, so they exist if and only if the
// effect does. Operators work the dead letters with the idem CLI, package
// dlq, or the failure console (console, console/index). Metrics, health and
// readiness are in metrics.
//
// # Package map
//
// What to import for what:
//
//   - consumer: run a consumer group (Run, Config), key extractors,
//     batching, lanes, ordering by key, readiness.
//   - handler: the Handler contract, Message, and the error classes
//     (Permanent, Decode, RetryAfter, DeferUntil), typed handlers (Typed,
//     TypedBatch); imports only the standard library.
//   - serde: Avro, Protobuf and JSON Schema in Confluent's wire format,
//     with a schema registry client, for typed handlers.
//   - step: durable steps: a call outside the database recorded once per
//     message and step, with a derived idempotency key for the provider.
//   - dedupe: the inbox stores (Postgres, PostgresLease, Memory), Tx for the
//     handler's transaction; dedupe/dedupetest is the conformance suite of a
//     store of your own.
//   - retrytopic: retry tiers and dead-letter topics, and the idem-* headers
//     of the wire contract.
//   - recovery: per-error rules (attempts, backoff, tier ladder, DLQ topic).
//   - breaker: circuit breakers and per-dependency rate and concurrency
//     limits.
//   - outbox: enqueue events in the handler's transaction; the relay that
//     publishes them.
//   - schedule: messages deferred with handler.DeferUntil, published again
//     when due.
//   - saga: orchestrated sagas with compensations, state in PostgreSQL.
//   - checkpoint: table-driven batch jobs that resume after a crash.
//   - dlq: list, show, replay and purge dead-letter records (the CLI's
//     library).
//   - console and console/index: the failure console's web UI and API, and
//     the indexer that fills the failure index it reads.
//   - metrics: every Prometheus metric idem exports, and Serve for
//     /metrics, /healthz and /readyz.
//   - kafkaauth: TLS and SASL (PLAIN, SCRAM, OAUTHBEARER) for sarama; MSK
//     IAM in the module kafkaauth/awsmsk.
//   - idemtest: the test kit: the real pipeline inside go test, on an
//     in-process Kafka or a real broker, with a PostgreSQL schema per test.
//   - idem (this package): Migrate, every table at once.
//
// Commands: cmd/idem is the operator's CLI (dead letters, ordering, outbox,
// checkpoints, migrate, topics, produce, console). Runnable examples:
// examples/orders-service (a small complete service), examples/payments-consumer
// (the reference service and make run's demo), examples/order-saga.
//
// # Start
//
// Create the tables once per start, then run the consumer:
//
//	if err := idem.Migrate(ctx, pool); err != nil {
//		log.Fatal(err)
//	}
//	err := consumer.Run(ctx, consumer.Config{
//		Brokers: brokers,
//		Group:   "orders",
//		Topics:  []string{"orders"},
//		Dedupe:  dedupe.NewPostgres(pool),
//	}, h)
//
// The README walks the quick start; the guides under docs/ cover guarantees,
// operations, performance, secured clusters, the CLI, the outbox, sagas and
// checkpoints, and the failure console.
package idem

// Package dedupe makes processing a Kafka message idempotent: it records,
// per consumer group, which idempotency keys have already had their effects,
// so that a redelivered message — after a crash, a rebalance, a retry-topic
// round trip or a DLQ replay — becomes a no-op instead of a second charge.
//
// # Choosing a store
//
//   - Postgres, the transactional inbox, for handlers whose effects are
//     PostgreSQL writes (including outbox rows). The key is recorded in the
//     same transaction as the effects, so both commit or neither does:
//     effectively-once effects.
//   - PostgresLease, for handlers whose effects are outside PostgreSQL (an
//     HTTP call). It claims the key for a lease, runs the handler, then marks
//     the key done. Effects may repeat after a crash at the wrong moment, so
//     pass the key on to the external system (an Idempotency-Key header).
//   - Memory, for tests and demos only: process-local and forgotten on exit.
//
// # Using the inbox
//
//	store := dedupe.NewPostgres(pool)               // table idem_processed
//	if err := store.Migrate(ctx); err != nil { // idempotent; idem.Migrate creates every idem table
//		log.Fatal(err)
//	}
//	rec := dedupe.Record{Group: "payments", Key: "pay-42", Topic: "payments", Partition: 0, Offset: 1234}
//	out, err := store.Process(ctx, rec, func(ctx context.Context) error {
//		tx := dedupe.Tx(ctx) // the inbox's transaction: write through it
//		_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, "pay-42", 1999)
//		return err
//	})
//	var storeErr *dedupe.StoreError
//	switch {
//	case errors.As(err, &storeErr): // the database failed: retry later; nothing is lost
//	case err != nil: // the handler failed: classify (retry tier, DLQ)
//	case out == dedupe.Duplicate: // already done earlier: just mark the offset
//	default: // Processed: effects and key committed together
//	}
//
// The consumer package does all of this for you; you only configure
// Config.Dedupe.
//
// # Guarantees, in plain words
//
//   - A key is recorded only when its handler succeeded — never before. A
//     handler that fails or panics leaves no trace, so the message is tried
//     again; it is never dropped as a false duplicate.
//   - With Postgres, for one (group, key), the handler's transactional effects
//     are committed at most once, even when two members process the same
//     message at the same moment: the second waits for the first and then
//     sees a Duplicate.
//   - A handler's own error comes back unchanged. A failure of the store
//     itself comes back as a *StoreError (errors.As), which is always safe
//     to retry: the message was not recorded, or its outcome is unknown and a
//     retry will see a Duplicate if it was.
//   - Keys are kept for the Sweeper's retention (default 14 days).
//     consumer.Run runs the Sweeper itself for Postgres and PostgresLease
//     (consumer.Config.Retention); elsewhere run it yourself. A message
//     delivered again after its key was swept runs again, so retention must
//     exceed your longest retry and DLQ-replay window.
//
// What dedupe cannot do: make an effect outside the database transaction
// (an HTTP call, an email, a write through another connection) atomic with
// the record. Such effects are at-least-once; make them idempotent with the
// key.
//
// # Schema
//
// Migrate creates (table name configurable with WithTable):
//
//	idem_processed(consumer_group text, idempotency_key text, topic text,
//	    "partition" int, "offset" bigint,
//	    processed_at timestamptz not null default now(),
//	    status text not null default 'done',       -- or 'in_progress' (PostgresLease)
//	    lease_until timestamptz, lease_owner text,
//	    primary key (consumer_group, idempotency_key))
//	plus an index on processed_at for the Sweeper.
//
// # A partitioned inbox
//
// At billions of rows, deleting old keys one by one costs more than the
// inbox itself: WAL, dead tuples, vacuum. WithPartitions (given to
// idem.Migrate through idem.Inbox as well, or `idem migrate
// --partitioned-inbox`) range-partitions
// the table by processed_at, a partition a day or a week; the Sweeper then
// drops whole partitions past the retention and makes the next ones ahead
// of time. A plain table is converted in place: it becomes the oldest
// partition, and no row moves. No index spans the partitions, so a key's
// check takes the key's advisory lock first, then looks the key up in every
// partition (one probe of each partition's primary key) and inserts it only
// if none has it: a key is a duplicate for as long as any partition holds
// it, at any boundary and under any concurrency. docs/partitioned-inbox.md
// has the argument, the migration and the measured costs.
//
// # Custom stores
//
// Any type implementing Store can be used; run package dedupetest's
// conformance suite against it.
package dedupe

// Package schedule stores messages a handler deferred (handler.DeferUntil)
// and publishes them again when they come due, so a wait of hours or days
// holds neither a partition nor a retry tier.
//
// A consumer (consumer.Run, with Config.Defer set to a Scheduler) whose
// handler returns handler.DeferUntil(t) rolls the handler's transaction back
// (the inbox records nothing for the key) and, in the transaction that
// settles the message, inserts a record of it into idem_deferred: the
// message's key, value and headers, its idempotency-key among them, plus
// retrytopic's idem-original-* headers naming where it was first consumed,
// to be published to the source's deferred topic
// ("<source>.<group>.deferred"). The consumer then commits the message's
// offset at once: the partition flows on. The group's Scheduler (one leader per group, elected by a PostgreSQL advisory
// lock) publishes the record when t comes by the database's clock, waking by
// a timer for the next due row and by a NOTIFY at each insert, and deletes
// the row once Kafka acknowledged it. The copy is consumed like any record:
// same key, value and headers, so the same idempotency key and origin.
//
// # Guarantee
//
// Each deferred message is handled once. Publication is at least once (a
// leader killed between Kafka's ack and the delete leaves the row, and the
// next leader publishes it again), and never early: a row is read only once
// its due_at <= now() in the database. Copies are handled once because the
// inbox records an idempotency key only when the handler succeeds: the
// first copy handled has the effects, later copies are duplicates. Scheduler's
// doc, "Guarantee", has the argument; TestLeaderSIGKILLLosesNone shows it.
//
// Deferred records leave their key's order: each goes out at its own time.
//
// # Table
//
// idem_deferred (in the connection's search_path) is created by idem.Migrate
// (pgmigrate component "schedule") or Scheduler.Run: id, consumer_group,
// topic, partition, key, value, header_keys, header_values,
// record_timestamp, idempotency_key, origin_topic, origin_partition,
// origin_offset, deferred_until (the time asked for), due_at (the next try),
// created_at, attempts, last_error, key_id and sealed (the value and headers
// sealed at rest: Scheduler.EncryptionKeyFile), dlq_topic (where a stub of
// a message whose sealed payload cannot be opened goes); `idem schedule
// list` shows it.
//
// # Defaults
//
// BatchSize 500, MaxWait 30s, LeaderRetry 1s, RetryBase 100ms, RetryMax
// 30s, StatsInterval 5s, QueryTimeout 30s (Default* constants). A due time
// may be at most handler.MaxDefer (90 days) plus a day ahead.
//
// # Metrics
//
// idem_schedule_pending, idem_schedule_published_total,
// idem_schedule_publish_failures_total, idem_schedule_leader and
// idem_schedule_dead_lettered_total, labelled by group
// (Scheduler.Registerer).
package schedule

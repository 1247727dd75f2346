// Package consumer runs a Kafka consumer group whose messages are safe to
// retry: every message goes through an idempotency inbox (package dedupe)
// before and together with your handler, failures go through retry topics to a
// dead-letter topic (package retrytopic), and an offset is committed only once
// the message's outcome is durable.
//
// # Walkthrough
//
// A service embeds one call to [Run] in its main (examples/orders-service is
// a complete one, with metrics and readiness):
//
//	func main() {
//		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//		defer stop()
//
//		pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//		if err != nil {
//			log.Fatal(err)
//		}
//		// Every table idem needs; idempotent, so it is safe at every start.
//		if err := idem.Migrate(ctx, pool); err != nil {
//			log.Fatal(err)
//		}
//
//		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
//			var p Payment
//			if err := json.Unmarshal(m.Value, &p); err != nil {
//				return handler.Decode(err) // poison: to the dead-letter topic at once
//			}
//			// The inbox's transaction: these writes commit with the inbox row, or not at all.
//			_, err := dedupe.Tx(ctx).Exec(ctx,
//				`UPDATE orders SET status = 'paid' WHERE id = $1 AND status = 'pending'`, p.OrderID)
//			return err // other errors are retried
//		})
//
//		err = consumer.Run(ctx, consumer.Config{
//			Brokers: []string{"kafka-1:9092", "kafka-2:9092"},
//			Group:   "billing",
//			Topics:  []string{"payments"},
//			// Where the idempotency key is; a message without one is dead-lettered.
//			KeyFunc: consumer.HeaderKey("idempotency-key"),
//			Dedupe:  dedupe.NewPostgres(pool), // Run also sweeps it (Config.Retention)
//			Retry: consumer.RetryConfig{
//				Tiers: retrytopic.Policy{Delays: []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute}},
//			},
//		}, h)
//		if err != nil {
//			log.Fatal(err) // only fatal errors: bad config, unknown topic, and so on
//		}
//	}
//
// What Run does, in order:
//
//  1. It validates the [Config] (an error wrapping [ErrInvalidConfig] names
//     each bad field) and fills every zero optional field with its documented
//     default.
//  2. It connects, checks that every source topic exists ([ErrUnknownTopic];
//     idem never creates source topics) and creates the missing retry-tier and
//     dead-letter topics, each with at least as many partitions as its source.
//  3. It opens an idempotent, acks=all producer on a client of its own for
//     forwarding failed records. With Config.Ordering [ByKey] it also prepares
//     its tables in ByKey's pool and first forwards any record a crash left
//     half-forwarded.
//  4. It starts the inbox sweeper when Config.Dedupe is a PostgreSQL store
//     (see Inbox retention below), joins the group, subscribed to the source
//     topics and their retry tiers, and consumes until ctx is cancelled,
//     joining again after every rebalance. A new group starts at the oldest
//     offset (Config.StartAt).
//  5. Each claimed partition gets one worker goroutine. For each message, in
//     offset order, the worker: holds a retry-tier record until its due time;
//     derives the idempotency key (Config.KeyFunc); with ByKey ordering, parks
//     it if an earlier message of its Kafka key is in a retry tier; runs the
//     handler inside Dedupe.Process — with dedupe.NewPostgres that is BEGIN, INSERT the inbox
//     row (a conflict means a duplicate: the handler is not called), the
//     handler, then COMMIT on nil or ROLLBACK on an error; classifies an error
//     (package handler) and retries in process or forwards the record; and
//     finally marks the offset for commit.
//
// Run returns nil after ctx is cancelled and everything it started has ended,
// and an error only for a fatal problem (see [Run]).
//
// # Exactly-once effects, at-least-once everything else
//
// Kafka delivers at least once, and so does idem: a message may reach your
// handler more than once. What idem makes exactly-once is the EFFECT recorded
// in PostgreSQL. With dedupe.NewPostgres the inbox row (consumer group,
// idempotency key) and the handler's writes through dedupe.Tx(ctx) — business
// rows and outbox rows alike — commit in one PostgreSQL transaction, and the
// offset is marked only after that COMMIT. So, per group and key:
//
//   - A handler that returns nil has its transactional writes committed once;
//     any later delivery of the same key (a redelivery, a retry-tier copy, a
//     DLQ replay, a producer's duplicate send) finds the inbox row and is
//     skipped as a duplicate without calling the handler.
//   - A handler that fails leaves nothing behind: the transaction rolls back,
//     no key is recorded, and the message is tried again.
//   - Two members handling the same key at the same moment (during a
//     rebalance) serialise on the inbox's primary key: one commits, the other
//     sees a duplicate.
//
// What stays at-least-once: delivery, and therefore the handler code itself,
// which runs again for every attempt that did not commit (in-process retries,
// retry tiers, a redelivery after a crash or a revoke). Side effects outside
// the transaction — an HTTP call, an e-mail, a write through another
// connection — may repeat. For those use dedupe.NewPostgresLease, which
// claims the key for a lease so that only one member runs the handler at a
// time and records the key once it succeeded, and make the external call
// idempotent with the key (for example an Idempotency-Key header): a crash
// between the external effect and the record still repeats the call. The
// inbox dedupes by key, not by content, and only for as long as it keeps
// the key (Config.Retention.Keep). dedupe.NewMemory is for tests: it forgets
// everything on exit.
//
// # Inbox retention
//
// The inbox would grow for ever, so Run deletes its old rows itself when
// Config.Dedupe is a PostgreSQL store (dedupe.NewPostgres or
// dedupe.NewPostgresLease): a dedupe.Sweeper runs beside the consumer and
// deletes, every minute and in batches, the rows processed more than
// Config.Retention.Keep ago (default 14 days). Retention.NoSweep turns it
// off, for a service that sweeps in a cron job of its own. A key must outlive
// every copy of its message that may still arrive, so Validate requires Keep
// to be at least the retention of the retry-tier and dead-letter topics
// (Retry.Tiers.Retention, 7 days by default): that is how long a record can
// wait in a tier, or in the dead-letter topic for an operator to replay it. [Migrate]
// creates the inbox table with every other table idem keeps.
//
// # Ordering
//
// Messages of one partition are handled one at a time, in offset order, by
// that partition's worker; different partitions (and retry-tier partitions)
// are handled concurrently, so the handler must be safe for concurrent use.
//
// In-process retries keep order: the partition waits for its message (the
// waits follow Config.Retry.Backoff, or a longer handler.RetryAfter) and
// later messages queue behind it. Retry tiers do not: a record forwarded to a
// tier leaves the source partition, which moves on, so later messages of the
// same key can be handled before it (with the default, zero [Ordering]). A
// tier record keeps its partition number and is held until its due time,
// never handled early; only that tier partition waits. With Ordering:
// ByKey(pool), while a message of a Kafka record key is in a retry tier,
// later messages of that key are parked in PostgreSQL (in pool) behind it
// and their offsets committed; when it succeeds or is dead-lettered, the
// parked messages are handled in their original order. Records with an empty Kafka key are never parked.
//
// # Commits
//
// An offset is marked only when its message's outcome is final and durable:
// committed by the handler's transaction, found to be a duplicate, forwarded
// to a retry tier or the dead-letter topic and acknowledged by all in-sync
// replicas, or (with ByKey ordering) parked. Marked offsets are committed every
// Config.CommitInterval, when a partition is revoked, and at shutdown; never
// before the outcome is durable. A crash therefore means redelivery from the
// last committed offset: messages already committed become duplicates that
// the inbox turns into no-ops, and messages that had failed are tried again
// (a record forwarded just before the crash may be forwarded a second time;
// once either copy succeeds, the other is a duplicate).
//
// # Rebalances and shutdown
//
// idem uses the cooperative-sticky assignor unless the base sarama config
// names strategies other than sarama's range default, so a rebalance stops
// only the partitions that move. Config.OnAssigned and Config.OnRevoked are
// called as partitions come and go, and a [Readiness] reports whether the
// group is joined.
//
// Cancellation follows one rule, the handler contract of handler.Handler:
// when a partition is revoked or Run's ctx is cancelled, its worker takes no
// new message and any wait ends at once (a backoff between retries, a tier's
// due time, an outage backoff), leaving that message unmarked for the next
// owner. A handler already running is not interrupted: it gets
// Config.ShutdownGrace (10s by default) to finish, and its result counts (a
// success is committed and marked, a permanent failure is still
// dead-lettered, a retriable one is left for the next owner). Only when the
// grace runs out is the handler's ctx cancelled; its transaction then rolls
// back and the message is redelivered to the partition's next owner. Validate
// requires ShutdownGrace to be shorter than
// Sarama.Consumer.Group.Rebalance.Timeout. The handler's ctx carries the
// values of Run's ctx, not its cancellation.
//
// # Outages are waited out, not counted
//
// A failure of the dedupe store itself (dedupe.StoreError: the database is
// down, a begin or commit fails, a lease is held elsewhere) is not a failed
// attempt: the partition tries the same message again after a backoff (full
// jitter from 100ms, doubling, capped at Config.OutageBackoff), for as long as
// it takes, spending no retries and forwarding nothing. Forwarding to a retry
// tier or the dead-letter topic that fails (the broker is unavailable) is
// retried the same way and the offset stays unmarked: nothing is dropped.
// A failed join of the group is retried the same way too. A handler error
// wrapping an open circuit breaker (package breaker) means a dependency is
// down: every partition of this consumer is paused for the breaker's
// cool-down, then one message goes through as the half-open probe; no retries
// are spent and nothing is forwarded (see BreakerMetrics). A KeyFunc or
// Config.TypeOf that meets an open breaker (a schema registry the key or the
// type is read through: serde's *UnavailableError) pauses the same way, and
// the key or type is derived again after it. Store and forwarding outages
// are waited out by each partition on its own.
//
// # Keys
//
// The idempotency key identifies the business event, the same for every
// copy of it. Config.KeyFunc finds it; set it explicitly to where your
// producers put it:
//
//   - [HeaderKey]("idempotency-key"), the default: the last header of that name.
//   - [RecordKey](): the Kafka record key, when it is an event id (not an
//     entity id that many events share).
//   - [JSONField]("meta.event_id"): a string or number field of a JSON value.
//   - [FirstOf](...): the first of several that finds a key.
//
// A key that is absent, empty, longer than Config.MaxKeyLength bytes, not
// valid UTF-8, holding a NUL, or for which KeyFunc returns an error is
// missing. With [MissingKeyDeadLetter], the default, the message goes to the
// dead-letter topic with kind "missing-key" (or "invalid-key") and the
// handler is not called: without a key a retry cannot be made safe.
// [MissingKeyUseCoordinates] uses "<topic>/<partition>/<offset>" of the
// original record instead, which dedupes redeliveries but not a producer that
// sends the same event twice. Pointed at a topic whose producers never set
// the key, every message would quietly be dead-lettered, so when the first 10
// records Run sees of a source topic all miss their key it logs one WARN
// naming the topic and the KeyFunc in use (KeyFunc.String) with the
// extractor's error.
//
// # Attempts per message
//
// Config.Retry.Attempts applies to every delivery of a message: at the source
// topic and again in each retry tier. A message whose handler keeps returning
// a retriable error is therefore handled Attempts times at the source,
// forwarded to tier 1, handled Attempts times there, and so on; after the
// last tier's attempts it is dead-lettered:
//
//	Attempts  retry tiers   handler calls before the dead-letter topic
//	--------  -----------   ------------------------------------------------
//	1         none          1
//	4 (def.)  none          4
//	4 (def.)  2             12  (4 at the source + 4 in each tier)
//	a         n             a × (1 + n)
//	any       any           1 for handler.Permanent, handler.Decode and panics
//	                        (unless Retry.Panics); 0 for a missing key
//
// handler.Message.Attempt counts these calls across tiers. Two things end a
// delivery's in-process retries early: a handler.RetryAfter longer than
// Config.Retry.Backoff.Max when there are tiers (the message goes to the next tier at
// once), and a permanent error on any attempt (the dead-letter topic at
// once). Outages and open breakers are waited out and never counted; a
// message interrupted by a revoke or shutdown is redelivered with its count
// starting again from the source or tier record it was read from.
//
// # What goes to the dead-letter topic
//
// The dead-letter topic ("<topic>.<group>.dlq" by default, see
// retrytopic.Policy) receives, at once: handler.Permanent and handler.Decode
// errors, panics (unless Config.Retry.Panics), and messages without a valid
// key. Other errors — ordinary, handler.RetryAfter, handler timeouts, and
// panics with Retry.Panics — go through the attempts above: in-process
// retries at the source and in each retry tier of Config.Retry.Tiers (none by
// default), and the dead-letter topic after the last tier. A
// dead-lettered record keeps its key, value and headers byte for byte and its
// partition number, and carries idem-* headers saying why (error, kind, Go
// type, panic stack), where it came from and how many attempts it had. Never
// dead-lettered: store outages, open breakers, failed forwards, and messages
// interrupted by a revoke or shutdown. Package dlq and the idem command list,
// show and replay dead-lettered records.
//
// # Failure classes
//
// Every error an attempt ends with is classified once, by one function
// (classify.go), into exactly one class:
//
//   - handler failure: the handler's error, a timeout, a COMMIT refused
//     because of the handler's writes (SQLSTATE 23 deferred constraint, 40
//     serialization), any other SQLSTATE of the handler's statements. In-process
//     retries (Retry.Attempts), then the retry tiers, then the dead-letter topic.
//   - permanent: handler.Permanent, handler.Decode, panics (unless
//     Retry.Panics), a missing or invalid key (checked before any database
//     call: valid UTF-8, no NUL, at most MaxKeyLength bytes), SQLSTATE 22
//     (data) and 54 (program limit). The dead-letter topic at once.
//   - outage: the dedupe store's own step failing in a way no message causes
//     (connection 08, 57P01-57P03, 53300, 58, 25006 read-only, the inbox table
//     missing, an ambiguous COMMIT), the handler's connection dying under it,
//     an open breaker. The same message is tried again after a backoff; no
//     retry budget is spent, nothing is forwarded. A handler that loses its
//     connection on 5 tries in a row while the store works is a handler
//     failure instead, so no input can hold a partition for ever.
//
// Forward errors are classified in one place. A permanent refusal sends the
// record to the dead-letter topic whole, or as a stub without its value if
// the dead-letter topic refuses it too: MESSAGE_TOO_LARGE (10, and sarama's
// own check against Producer.MaxMessageBytes), RECORD_LIST_TOO_LARGE (18),
// INVALID_RECORD (87), INVALID_TIMESTAMP (32), INVALID_TOPIC_EXCEPTION (17),
// TOPIC_, CLUSTER_ and TRANSACTIONAL_ID_AUTHORIZATION_FAILED (29, 31, 53),
// UNSUPPORTED_FOR_MESSAGE_FORMAT (43), POLICY_VIOLATION (44) and
// UNSUPPORTED_COMPRESSION_TYPE (76). Every other forward error (an unknown
// topic, no leader, too few replicas, a network error) is an outage. idem_partition_stalled_seconds shows how long each
// partition has been failing on one message, and a WARN names the cause
// every minute once it passes StallWarning.
//
// # Routes
//
// Config.Routes runs several handlers in one Run: each message goes to the
// first [Route] that takes its topic and its type (Config.TypeHeader, such
// as CloudEvents' ce_type, or Config.TypeOf, such as a schema registry's
// record name), with that route's KeyFunc, Retry (rules, tiers, dead-letter
// topics), Expiry and Batch; the handler given to Run, if any, takes the
// rest with the Config's. Without it a message no route takes follows
// Config.Unmatched (dead-letter, or skip). Config.Filter skips messages
// before the inbox. A route's retry and dead-letter topics are the source
// topic's, as without routes, unless it asks for its own (Route.OwnTopics);
// Validate names the route and the field of every problem. The per-message
// metrics carry a route label ("default" for Run's handler). See
// docs/routes.md.
//
// # Batches and lanes
//
// Config.Batch puts consecutive new messages of a partition in one
// transaction (dedupe.BatchStore); Run passes them to a batch handler
// (handler.Batch) at once, and a batch handler batches 500 by default. A
// failed batch rolls back whole and its messages run again one per
// transaction, so only the failing one takes the failure path.
// Config.Concurrency spreads a partition over lanes by key; the committed
// offset is always the lowest unfinished one.
//
// # Live controls
//
// With Config.Controls (a pool; usually the dedupe store's) the member obeys
// its group's live controls, which an operator changes from idem console or
// the CLI (idem pause, idem resume, idem redrive), and writes a heartbeat
// row for the fleet page (idem fleet). A pause of a topic or a partition
// stops its handling until the resume: its fetching is paused
// (idem_partitions_paused{reason="operator"}), no message of it starts an
// attempt, and its offsets stay; a topic's pause holds its retry tiers and
// deferred topic for the group too. The pause is in PostgreSQL and every
// member LISTENs for changes, so it holds across restarts and rebalances:
// until a member has read the controls once, it handles nothing. A re-drive
// reads a window of a source topic again: the member that owns each
// partition holds it, handles each record of the window under the
// re-drive's replay epoch (handler.Message.Epoch, dedupe.Record.Epoch), so
// the inbox runs each key once more, and records its progress, which the
// partition's next owner resumes from after a crash. The group's offsets
// never move back. Every record whose origin lies in a window is handled
// under that window's epoch, however it comes (the re-drive's read, a live
// record the group had not reached yet, a retry tier, a redelivery). See
// docs/console.md, "Live controls".
//
// # Tracing
//
// Tracing goes through the OpenTelemetry API only (Config.TracerProvider,
// Config.Propagator); idem never imports an SDK. For each message attempt
// Run starts one span named "idem.handle", kind consumer, whose parent is
// the context the propagator extracts from the record's headers (W3C
// traceparent and tracestate by default), so it is a child of the
// producer's span. Its attributes: messaging.system "kafka",
// messaging.operation.type "process", messaging.destination.name (the topic
// read, a retry tier's for a retry), messaging.kafka.destination.partition,
// messaging.kafka.offset, messaging.consumer.group.name, idem.attempt
// (1-based, counted across tiers), idem.tier (0 for a source topic) and
// idem.outcome (below). A failed attempt records its error and status Error.
// The tracer's instrumentation scope is "github.com/idemhq/idem/consumer".
// The handler's ctx carries the span, so the handler's own spans (database,
// HTTP) are its children.
//
// The values of idem.outcome:
//
//   - "processed": the handler succeeded; effects committed.
//   - "duplicate": the key was already done; handler not called.
//   - "retry": failed; an in-process retry follows.
//   - "retried": failed; forwarded to a retry tier.
//   - "dead_lettered": failed (or no key); forwarded to the dead-letter topic.
//   - "outage": the dedupe store was unreachable; tried again, no attempt counted.
//   - "breaker_open": a breaker was open; the partition waits.
//   - "abandoned": cut short by revoke or shutdown; left for redelivery.
//   - "failed": a batch failed; its messages run again one by one.
//   - "deferred": the handler deferred it (handler.DeferUntil); stored for the scheduler.
//   - "expired": past its deadline or maximum age, and dropped (Expiry.Drop); handler not called.
//
// A record forwarded to a retry tier or the dead-letter topic gets the
// context of the attempt that forwarded it in its traceparent/tracestate
// headers (replacing the producer's), so one trace shows the original
// attempt, each tier's attempts as children of the attempt before, and the
// dead-letter record pointing at the last one. A message dead-lettered
// without an attempt (no key) gets a span too, with outcome dead_lettered.
//
// Batches (Config.Batch, handler.Batch): the new messages of a batch share
// one "idem.handle_batch" span around the handler call, linked (not
// parented) to each message's producer context; duplicates found by the
// batch's inbox INSERT get no span. A message run alone (not batchable, a
// retry record, or after its batch failed) gets "idem.handle" spans as
// above. Lanes (Concurrency > 1) trace like a single worker.
//
// # Testing
//
// Package idemtest runs Run end to end inside go test, on an in-process
// Kafka cluster, with a memory or PostgreSQL store: produce records, wait
// until the group has handled them, read the dead-letter topic.
package consumer

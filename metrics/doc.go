// Package metrics lists every Prometheus metric idem exports, in one table,
// so dashboards and alerts have one list to read (a test checks the table
// against the collectors). The consumer's collectors are consumer.Run's own
// (declared in idem's internal/coremetrics); the outbox relay, the saga
// orchestrator, the checkpoint runner and the deferred-message scheduler
// keep theirs in their own packages. Each component registers all its
// collectors on the one prometheus.Registerer its configuration names
// (consumer.Config.Registerer, outbox.Relay.Registerer,
// saga.Config.Registerer, checkpoint.Job.Registerer,
// schedule.Scheduler.Registerer); nothing is registered globally.
// NewServeMux and Serve expose a registry with /healthz and /readyz on one
// address.
//
// Labels are bounded: group, topic, partition, destination (a tier or DLQ
// topic), table, breaker name, saga type and step, batch job and the fixed sets of outcome, result, kind and
// reason values. Never idempotency keys, offsets or error texts.
//
// # Metrics
//
// Every metric idem registers (TestDocTable checks this table against every
// component's collectors: same names, types and labels, both ways). Label
// lists are comma-separated; "-" means none.
//
//	name                                   type       labels                    meaning
//	idem_messages_total                    counter    group,topic,route,outcome messages with a final outcome: processed, duplicate, retried (sent to a tier), dead_lettered, parked, deferred, expired (dropped), skipped (filtered, or unmatched); route is consumer.Route.Name, "default" for Run's handler, "" for a message no route took
//	idem_handler_attempts_total            counter    group,topic,route,result  handler calls by result: ok, error, panic, breaker_open, throttled
//	idem_handler_duration_seconds          histogram  group,topic,route         handler call latency including the dedupe transaction (1 ms to 30 s)
//	idem_retries_total                     counter    group,topic,route         in-process retries: handler attempts after a failure
//	idem_forwarded_total                   counter    group,destination,kind    records forwarded to a retry tier or the DLQ, by idem-error-kind
//	idem_forward_errors_total              counter    group,destination         failed forwards; the partition retries them and marks nothing
//	idem_stubs_forwarded_total             counter    group,destination         records dead-lettered as stubs without their value (no topic would take them whole)
//	idem_missing_key_total                 counter    group,topic,route         messages without a valid idempotency key
//	idem_deferred_total                    counter    group,topic               messages a handler deferred (handler.DeferUntil), stored for the group's scheduler; topic is the source
//	idem_lanes                             gauge      group                     handler attempts this member may run at once under consumer.Config.Limits.Adaptive (AIMD)
//	idem_expired_total                     counter    group,topic,route,action  messages past their deadline or topic's maximum age, not handled: dead_lettered (kind expired) or dropped
//	idem_filtered_total                    counter    group,topic,reason        messages consumer.Config.Filter skipped before the inbox, by the reason it gave
//	idem_unmatched_total                   counter    group,topic,action        messages no route took (consumer.Config.Unmatched): dead_lettered (kind permanent) or skipped
//	idem_store_errors_total                counter    group                     dedupe store failures (outages); the message is retried, no attempt counted
//	idem_retry_delay_seconds               histogram  group,topic               how long after its idem-due-at a retry record reached the handler
//	idem_dlq_depth                         gauge      topic                     DLQ records not yet replayed or purged (end offsets minus the "<dlq>.admin" group's offsets)
//	idem_breaker_state                     gauge      name                      circuit breaker state: 0 closed, 1 half-open, 2 open
//	idem_breaker_transitions_total         counter    name,from,to              circuit breaker state changes
//	idem_breaker_open_seconds_total        counter    name                      seconds circuit breakers spent open
//	idem_partitions_paused                 gauge      group,reason              paused partitions, each counted once under its first reason of operator (idem pause, the console), redrive, breaker, backpressure
//	idem_partitions_assigned               gauge      group                     partitions currently claimed by this process
//	idem_commits_total                     counter    group                     offsets marked for commit after a durable outcome
//	idem_abandoned_total                   counter    group                     in-flight messages cancelled past ShutdownGrace (rolled back, left for redelivery)
//	idem_partition_stalled_seconds         gauge      group,topic,partition     seconds a claimed partition has been failing on one message (outages, retries, forward errors); 0 while it flows
//	idem_consumer_lag                      gauge      group,topic,partition     records behind in a claimed partition: high watermark minus committed offset, sources and retry tiers (consumer.Config.LagInterval); removed when released
//	idem_consumer_lag_actionable           gauge      group,topic,partition     records of a claimed partition a member could start now: a source's or deferred topic's not committed, a retry tier's already due (idem-due-at), plus deferred messages due in PostgreSQL on the deferred topic's partitions; what to autoscale on
//	idem_consumer_lag_seconds              gauge      group,topic,partition     seconds the oldest actionable record has waited: since its timestamp, or since it came due (tier, deferred); 0 when none
//	idem_end_to_end_seconds                histogram  group,topic               record timestamp to offset marked (final outcome), 1 ms to 1 h for p95/p99; a tier record is timed from its forward
//	idem_messages_in_flight                gauge      group,topic               messages taken from a partition's queue whose outcome is not final yet
//	idem_outbox_pending                    gauge      table                     outbox rows waiting to be published, delayed ones included (refreshed by the leader)
//	idem_outbox_oldest_pending_seconds     gauge      table                     seconds the oldest outbox row the relay may publish now has waited, from its insert or its NotBefore when later; rows delayed to a later time, and rows held back behind them on their key, left out; 0 when none
//	idem_outbox_failed                     gauge      table                     outbox rows in the failed state
//	idem_outbox_published_total            counter    table                     outbox rows published and acknowledged by Kafka
//	idem_outbox_publish_seconds            histogram  table                     outbox row insert (about its commit), or its NotBefore when later, to Kafka's ack, latency
//	idem_outbox_publish_failures_total     counter    table,reason              refused or failed outbox publishes: unknown_topic, too_large, authorization, other; unreadable (sealed at rest, its data key destroyed: failed for good), no_key (sealed, the relay has no key: retried)
//	idem_outbox_leader                     gauge      table                     1 while this relay holds the table's lock, else 0
//	idem_saga_transitions_total            counter    type,state                sagas entering a state: running, waiting, compensating, completed, compensated
//	idem_saga_step_duration_seconds        histogram  type,step,result          saga step action latency by result: ok, pending, error, outage (breaker open)
//	idem_saga_compensations_total          counter    type,step,result          saga compensation calls: ok, error (errors are retried with backoff)
//	idem_saga_compensation_duration_seconds histogram type,step                 saga compensation call latency
//	idem_checkpoint_rows_total             counter    job                       batch rows processed in committed chunks
//	idem_checkpoint_chunks_total           counter    job,result                batch chunks: committed, failed (rolled back; the checkpoint did not move)
//	idem_checkpoint_chunk_duration_seconds histogram  job                       one chunk: read, process, commit with the checkpoint
//	idem_checkpoint_lock_wait_seconds      histogram  job                       waits for the job's advisory lock (another runner's chunk)
//	idem_schedule_pending                  gauge      group                     deferred records waiting to be published, due or not (refreshed by the group's scheduler leader)
//	idem_schedule_published_total          counter    group                     deferred records published when due and acknowledged by Kafka
//	idem_schedule_publish_failures_total   counter    group                     failed publishes of due deferred records (each retried with backoff)
//	idem_schedule_dead_lettered_total      counter    group                     deferred records whose payload, sealed at rest, could not be opened for good (data key destroyed): sent to the dead-letter topic as stubs
//	idem_schedule_leader                   gauge      group                     1 while this process's scheduler holds the group's lock, else 0
//
// The failure index (package console/index) exports three more gauges
// through index.Indexer.Registerer (idem console, or consumer.Run with the
// index switch) or console.Config.Registerer, documented with those
// fields: idem_dlq_unresolved and
// idem_dlq_oldest_unresolved_seconds by group and topic, and
// idem_dlq_retention_seconds by topic. The alert IdemDLQUnresolvedAging
// compares the last two.
//
// The flow limits of a breaker.Set's dependencies (rate, calls in flight,
// Retry-After pauses) are exported by the collector breaker.NewLimitCollector
// reads them with, documented there: idem_dependency_rate_limit,
// idem_dependency_max_in_flight and idem_dependency_in_flight (gauges), and
// idem_dependency_throttled_seconds_total and idem_dependency_throttled_total
// (counters by reason), all by dependency. consumer.Run registers it for
// consumer.Config.Limits.Breakers.
//
// # Reading them
//
// Success rate: rate(idem_messages_total{outcome=~"processed|duplicate"}) over
// rate(idem_messages_total). Latency: histogram_quantile(0.99,
// rate(idem_end_to_end_seconds_bucket[5m])). Autoscale on
// idem_consumer_lag_actionable and idem_consumer_lag_seconds, not on
// idem_consumer_lag: records parked in a retry tier, or deferred, count in the
// latter though no extra member can start them sooner (docs/kubernetes.md).
// A growing idem_consumer_lag with
// a flat idem_commits_total means a stuck consumer; idem_partition_stalled_seconds
// says which partition and the consumer's WARN log says why.
package metrics

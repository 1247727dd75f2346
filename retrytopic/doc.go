// Package retrytopic moves failed records through retry tiers to a dead-letter
// topic without ever losing one or handling one early.
//
// A record that still fails after the in-process retries is forwarded by the
// consumer (acknowledged with acks=all by an idempotent producer) to retry
// tier 1 "<topic>.<group>.retry.1", then tier 2, …, and finally to the
// dead-letter topic "<topic>.<group>.dlq" (Policy names them; Policy.Next says
// which comes next). Only after the forward is acknowledged does the consumer
// mark the source offset; a failed forward is retried, never dropped.
//
// Forwarded records keep their key, value (raw bytes, never re-encoded) and
// headers, and carry the wire contract's idem-* headers (DESIGN.md lists
// them), which say what a Failure says. Every forward replaces the idem-*
// headers; the original-* coordinates and the first failure time are carried
// over from the record's own headers, so a record deep in the tiers still
// says where it came from. idem-idempotency-key carries the idempotency key
// the consumer derived (from a header, a JSON field, …), so an operator or a
// tool sees the key of the inbox row without deriving it again. Only the
// names of the wire contract are idem's: any other header, even one named
// idem-… (outbox.Relay's idem-outbox-id), is the record's own, kept by every
// forward and by a DLQ replay. Package dlq reads a dead-lettered record's
// Failure (dlq.FromMessage) and its own headers (dlq.Record.OriginalHeaders).
//
// A tier consumer handles a record only once its due time has passed:
// records are never handled early (idem-due-at is rounded UP to the
// millisecond), and a revoked partition stops waiting at once.
//
// # Due times are bounded
//
// A record sent to tier n is due Policy.Delays[n-1] after the failure. A
// handler.RetryAfter is capped at that delay: it never moves the due time, so
// due times within a tier stay in write order and one record cannot hold a
// tier partition for longer than the delay. Policy.Validate rejects a delay
// above half of Policy.Retention: a record must not expire in its tier before
// it is due (its source offset is already committed).
//
// # Topics and size limits
//
// At start the consumer creates the missing tiers and dead-letter topic of
// each source topic with as many partitions as the source (so a record keeps
// its partition number and per-key order holds), Policy.Retention and
// Policy.ReplicationFactor, and the source's max.message.bytes plus 64 KiB
// for idem's headers (and its segment.bytes), so every record the source
// holds fits. Existing topics are never altered: a tier with fewer
// partitions than the source stops the start with an error naming it; a
// dead-letter topic with fewer (a rule's, shared by sources of different
// partition counts, or one made smaller by hand), a smaller limit, or a tier
// retention below twice its delay, is logged as a warning (nothing reads a
// dead-letter topic in key order: a record whose partition it lacks goes to
// one chosen by its key). The consumer creates a rule's shared dead-letter
// topic for the source with the most partitions. idem's
// forward producer is set up by ConfigureProducer, with topic auto-creation
// off: idem never creates a topic by producing to it.
//
// # Records no topic will take
//
// A refusal no retry can change (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE,
// INVALID_RECORD, authorisation failures, …) is told apart from an outage
// (unknown topic, no leader, network) to wait out. The consumer sends a
// record whose tier refuses it for good to the dead-letter topic instead, and
// a record the dead-letter topic refuses for good as a stub: key and headers
// kept, value nil, idem-payload-omitted giving the value's size and
// idem-forward-error the reason (Failure.Stub, Failure.OmittedBytes,
// Failure.ForwardError). Only a dead-letter topic refusing even the stub
// makes the partition wait. The consumer package's doc lists which producer
// errors are refusals.
package retrytopic

// Package retrytopic moves failed records through retry tiers to a dead-letter
// topic without ever losing one or handling one early.
//
// A record that still fails after the in-process retries is forwarded
// (Forwarder.Forward, acknowledged with acks=all by an idempotent producer) to
// retry tier 1 "<topic>.<group>.retry.1", then tier 2, …, and finally to the
// dead-letter topic "<topic>.<group>.dlq" (Policy names them; Policy.Next says
// which comes next). Only after the forward is acknowledged does the consumer
// mark the source offset; a failed forward returns a *ForwardError and the
// record is retried, never dropped.
//
// Forwarded records keep their key, value (raw bytes, never re-encoded) and
// headers, and carry the wire contract's idem-* headers (see the Header*
// constants), written by Encode and read by Decode. Every forward replaces the
// idem-* headers; the original-* coordinates and the first failure time are
// carried over from the record's own headers (NewFailure), so a record deep in
// the tiers still says where it came from.
//
// A tier consumer reads a record, then calls WaitDue(ctx, failure.DueAt, nil)
// before handling it: records are never handled early, and a revoked partition
// stops waiting at once.
//
// EnsureTopics creates the tiers and the dead-letter topic with at least as
// many partitions as the source topic, so a record keeps its partition number
// and per-key order holds.
//
//	pol := retrytopic.Policy{Delays: []time.Duration{time.Second, time.Minute}}
//	err := retrytopic.EnsureTopics(ctx, admin, pol.Topics("payments", "billing"), 12, pol)
//
//	prior, _, _ := retrytopic.Decode(msg.Headers)
//	f := retrytopic.NewFailure(err, retrytopic.Source{Topic: msg.Topic, Partition: msg.Partition,
//		Offset: msg.Offset, Timestamp: msg.Timestamp, Group: "billing"}, prior, time.Now())
//	dest, tier, delay := pol.Next(f.OriginalTopic, "billing", prior.Tier)
//	f.Tier, f.DueAt = tier, time.Now().Add(delay)
//	err = fwd.Forward(ctx, retrytopic.Record{Topic: dest, Partition: msg.Partition,
//		Key: msg.Key, Value: msg.Value, Headers: retrytopic.Encode(msg.Headers, f)})
package retrytopic

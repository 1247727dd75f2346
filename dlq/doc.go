// Package dlq is the operator's side of dead-letter topics: list pending
// failures grouped by cause, show one record, replay records to where they came
// from, purge, and measure depth.
//
// A dead-letter record is the record idem failed to handle, forwarded byte
// for byte (key, value, original headers) with the idem-* headers of the wire
// contract appended (see package retrytopic). Record decodes them.
//
// What is "pending" is kept in Kafka itself: the consumer group
// "<dlq-topic>.admin" (AdminGroup) has committed offsets marking how far
// operators have dealt with each partition. Nothing joins that group; Replay
// and Purge commit its offsets directly. Depth is the number of records past
// them, the number to alert on.
//
//	c, err := dlq.Open([]string{"127.0.0.1:9092"}, nil)
//	groups, err := c.List(ctx, "payments.billing.dlq")   // by fingerprint, largest first
//	f, err := dlq.ParseFilter("kind=retriable,error~=timeout")
//	res, err := c.Replay(ctx, dlq.ReplayOptions{Topic: "payments.billing.dlq", Filter: f, Rate: 50})
//
// Replay keeps the idempotency-key header, so replaying a record that had in
// fact been handled is harmless: the consumer's inbox drops it as a duplicate.
package dlq

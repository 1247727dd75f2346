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
// Replay sends each record back to its idem-original-topic (the default,
// ReplayOptions.To ""), or to a topic named explicitly, typically a retry tier:
//
//	res, err = c.Replay(ctx, dlq.ReplayOptions{Topic: "payments.billing.dlq",
//		To: "payments.billing.retry.1"}) // keeps the idem-* history, due now
//
// idem never guesses a destination's name and never creates a topic: every
// Client has Metadata.AllowAutoTopicCreation off and checks each destination
// with a metadata request before sending to it. A named destination that does
// not exist is an error (ErrUnknownTopic) before anything is read; a record
// whose original topic does not exist stops Replay at that record, and the
// admin group is not committed past it, so List still shows it.
//
// Replay keeps the idempotency-key header, so replaying a record that had in
// fact been handled is harmless: the consumer's inbox drops it as a duplicate.
// Each replayed record also names the dead letter it came from in
// idem-replay-of, a header that survives the consumer's forwards: if
// it fails again, its new dead letter says which one it repeats
// (Record.ReplayedFrom).
//
// Records are decoded leniently (see Record): key, value and headers are kept
// byte for byte whatever they hold, and idem-* headers that do not parse are
// reported in Record.DecodeErr, never as a panic.
package dlq

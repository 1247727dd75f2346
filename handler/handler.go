package handler

import (
	"context"
	"time"
)

// Header is one Kafka record header. Values are raw bytes; idem's own headers
// (prefixed "idem-") are UTF-8 text.
type Header struct {
	Key   string // the header name
	Value []byte // the raw value
}

// Message is one Kafka record as a Handler sees it.
//
// A Message and the slices it holds belong to idem: the handler must not keep
// or use them after Handle returns (copy what you need).
type Message struct {
	// Topic, Partition and Offset locate the record that is being handled. For a
	// record read from a retry tier they are the tier's coordinates: switch on
	// Origin().Topic, not Topic, to tell your source topics apart.
	Topic     string
	Partition int32
	Offset    int64
	// Key and Value are the record's raw bytes; Value is nil for a tombstone.
	Key   []byte
	Value []byte
	// Headers are the record's headers, in order.
	Headers []Header
	// Timestamp is the record's timestamp.
	Timestamp time.Time
	// IdempotencyKey is the key the dedupe store records, as KeyFunc derived it
	// (by default the "idempotency-key" header).
	IdempotencyKey string
	// Attempt counts deliveries of this message to a handler, starting at 1. It
	// includes in-process retries and earlier retry tiers.
	Attempt int
	// Original is where the record was first consumed, as the consumer fills
	// it: the record's own Topic, Partition, Offset and Timestamp for a record
	// of a source topic, and the values of its idem-original-* headers for a
	// record read from a retry tier. Read it through Origin, which also works
	// for a Message built by hand (in a unit test) with Original left zero.
	Original Origin
	// Epoch is the replay epoch the message is handled under: 0, or, for a
	// record inside the window of a re-drive (`idem redrive`, the console's
	// Re-drive), that re-drive's epoch. The inbox keys the message by
	// (IdempotencyKey, Epoch), so a re-drive runs each key of its window
	// once more. A handler whose effects reach a system with idempotency
	// keys of its own (a payment provider) decides whether a re-drive
	// repeats them there: IdempotencyKey alone makes the provider answer
	// the first call's result again; IdempotencyKey with Epoch makes a new
	// call.
	Epoch int64
}

// Origin locates a record in the topic it was first consumed from.
type Origin struct {
	Topic     string    // the source topic, never a retry tier
	Partition int32     // the partition there
	Offset    int64     // the offset there
	Timestamp time.Time // the record's timestamp there
}

// Origin returns where the message was first consumed: m.Original when it is
// set (always, for messages the consumer passes to a handler), otherwise the
// message's own Topic, Partition, Offset and Timestamp. Outside retry tiers
// both are the same; in a retry tier Origin names the source topic while
// Topic names the tier.
func (m *Message) Origin() Origin {
	if m.Original.Topic != "" {
		return m.Original
	}
	return Origin{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Timestamp: m.Timestamp}
}

// Header returns the value of the last header named key, and whether it exists.
func (m *Message) Header(key string) ([]byte, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if m.Headers[i].Key == key {
			return m.Headers[i].Value, true
		}
	}
	return nil, false
}

// Handler processes one message.
//
// The contract:
//   - idem calls Handle from one goroutine per claimed partition, so messages of
//     one partition arrive one at a time, in offset order. Different partitions
//     are handled concurrently: a Handler must be safe for concurrent use.
//   - Cancellation. When the partition is revoked (a rebalance) or the
//     consumer shuts down, a Handle already running is not interrupted: it
//     gets the consumer's ShutdownGrace (10s by default) to finish, and its
//     result counts. Only when that grace runs out is ctx cancelled; Handle
//     must then return promptly, its transaction is rolled back, its error is
//     ignored, and the message is redelivered to whoever owns the partition
//     next. A Timeout middleware also cancels ctx, at its deadline (an error
//     of kind timeout).
//   - When the dedupe store is transactional, ctx carries the transaction
//     (dedupe.Tx(ctx)); writes made through it commit atomically with the inbox
//     row, and only if Handle returns nil.
//   - Returning nil means the effects are done; idem records the key and commits
//     the offset. Returning an error rolls the transaction back; the error's
//     class decides what happens next: Permanent errors are dead-lettered at
//     once, others are retried (RetryAfter sets the delay).
//   - A panic is recovered by idem, turned into an error of kind "panic" that
//     carries the stack, and treated as configured (dead-lettered by default).
//   - The message must not be used after Handle returns.
type Handler interface {
	Handle(ctx context.Context, m *Message) error
}

// Func adapts an ordinary function to a Handler, like http.HandlerFunc.
type Func func(ctx context.Context, m *Message) error

// Handle calls f(ctx, m).
func (f Func) Handle(ctx context.Context, m *Message) error { return f(ctx, m) }

var _ Handler = Func(nil)

// Middleware wraps a Handler with behaviour of its own, like net/http middleware.
type Middleware func(Handler) Handler

// Chain wraps h with the middlewares; the first listed is the outermost, so
// Chain(h, a, b) calls a, then b, then h.
func Chain(h Handler, mws ...Middleware) Handler {
	for i := len(mws) - 1; i >= 0; i-- {
		h = mws[i](h)
	}
	return h
}

// Package handler defines what idem calls for every Kafka message — the
// [Handler] — and how its errors decide what happens to the message next.
//
// It imports only the standard library, so that business code implementing a
// Handler depends on nothing else of idem's.
//
// # Writing a handler
//
// A Handler has one method; [Func] adapts an ordinary function, like
// http.HandlerFunc:
//
//	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
//		var p Payment
//		if err := json.Unmarshal(m.Value, &p); err != nil {
//			return handler.Decode(err) // poison bytes: dead-letter, never retry
//		}
//		tx := dedupe.Tx(ctx) // the inbox's transaction (package dedupe)
//		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1 AND status = 'pending'`, p.OrderID)
//		return err // nil: committed together with the inbox row
//	})
//
// # The contract
//
// idem promises the handler, and asks of it, the following (the [Handler]
// type documents the same contract):
//
//   - Goroutines. Handle is called from one goroutine per claimed partition.
//     Messages of one partition arrive one at a time, in offset order; different
//     partitions are handled concurrently, so a Handler must be safe for
//     concurrent use.
//   - Cancellation. When the partition is revoked (a rebalance) or the
//     consumer shuts down, a Handle already running is not interrupted: it
//     gets the consumer's ShutdownGrace (10s by default) to finish, and its
//     result counts. Only when that grace runs out is ctx cancelled; Handle
//     must then return promptly, its transaction is rolled back, its error is
//     ignored, and the message is redelivered to whoever owns the partition
//     next. A [Timeout] middleware also cancels ctx, at its deadline (an
//     error of kind timeout).
//   - The transaction. With the transactional inbox (dedupe.NewPostgres) ctx
//     carries a pgx.Tx, returned by dedupe.Tx(ctx). Business writes and outbox
//     rows made through it commit atomically with the inbox row, and only if
//     Handle returns nil. Never commit or roll it back yourself. Effects outside
//     it (HTTP calls, e-mails, writes through another connection) are
//     at-least-once: they may happen again when the message is retried.
//   - The correlation id. ctx carries the message's correlation id, while
//     Handle runs: its idem-correlation-id header, or its idempotency key
//     (outbox.CorrelationID reads it; the events the handler enqueues and
//     the sagas it starts carry it on). A batch handler's ctx has none.
//   - The message. A [Message] and the slices it holds (Key, Value, Headers)
//     belong to idem: do not keep or use them after Handle returns; copy what
//     you need.
//   - Panics. A panic is recovered (consumer.Run recovers it inside every
//     middleware it is given), turned into a [*PanicError] of kind "panic" that carries the stack, and
//     dead-lettered at once unless the consumer's Config.Retry.Panics is set.
//   - Attempts. [Message.Attempt] counts deliveries of this message to a
//     handler, from 1, including in-process retries and earlier retry tiers, so
//     a handler may log or alert on it (package consumer's "Attempts per
//     message" says how many there are). Retries are safe because the inbox
//     dedupes by [Message.IdempotencyKey].
//   - Origin. In a retry tier, Topic, Partition and Offset are the tier's;
//     [Message.Origin] names the record where it was first consumed, so a
//     handler serving several topics switches on m.Origin().Topic.
//
// # Error classification
//
// Returning nil means the effects are done: the transaction commits, the key is
// recorded and the offset is marked for commit. Any error rolls the transaction
// back; its class ([ErrorKind], written to the idem-error-kind header of a
// forwarded record) decides what happens next:
//
//	handler returns                  kind         what happens
//	-------------------------------  -----------  ------------------------------------------------
//	nil                              ""           commit; key recorded; offset marked
//	any other error (incl. ctx       retriable    retried in process (Config.Retry, full-jitter
//	  errors not caused by revoke)                backoff), then retry tier 1, 2, … (each with
//	                                              its own in-process retries), then the DLQ
//	RetryAfter(err, d)               retriable    as above, but each in-process wait is at least
//	                                              d (a d above Retry.Backoff.Max with tiers
//	                                              goes to the tier at once); in a retry tier, d
//	                                              is capped at the tier's delay (due = failure +
//	                                              delay)
//	the error of Timeout(d)          timeout      retriable, as above; errors.Is(err, ErrTimeout)
//	HTTPStatus(err, code)            err's kind   as err; the status is there for recoverability
//	                                              rules (package recovery)
//	Permanent(err)                   permanent    dead-letter topic at once, no retries
//	Decode(err)                      decode       dead-letter topic at once; bytes kept unchanged
//	a panic (*PanicError)            panic        dead-letter topic at once, or retriable when
//	                                              the consumer's Retry.Panics is set
//	(no valid key: *MissingKeyError, missing-key  dead-letter topic at once, before the handler
//	  raised by idem itself)         or           runs (unless keys fall back to coordinates);
//	                                 invalid-key  invalid-key: not UTF-8, a NUL, or too long
//	an SQL error of class 22 or 54   permanent    dead-letter topic at once (the same input
//	  (pgconn.PgError)                            fails the same way); other SQLSTATEs are
//	                                              retriable, connection losses are waited out
//
// Two more kinds of failure are not the message's fault and are waited out
// instead, spending no retries and forwarding nothing: an error wrapping an
// open circuit breaker (package breaker; the consumer pauses its partitions
// until the cool-down ends) and a failure of the dedupe store itself
// (dedupe.StoreError; the same message is tried again with backoff).
//
// A handler may also ask for the message later rather than fail it:
// [DeferUntil] returns an error that [DeferredUntil] recognises, which is not
// a failure.
// The consumer stores the message in PostgreSQL, commits its offset at once
// and its group's scheduler (package schedule) publishes it again when the
// time comes, with the same idempotency key and origin; no retry is spent
// and nothing is forwarded. A time more than [MaxDefer] away is refused with
// a Permanent error that names the time asked for and the limit.
//
// When several markers are present the first of missing-key, panic, decode,
// permanent, timeout wins; [IsRetriable] is true for kinds retriable and
// timeout. The markers wrap with Unwrap, so errors.Is and errors.As still find
// the original error, and they may be wrapped again with fmt.Errorf("…: %w").
// The idem-error-type header names the type of the error under idem's own
// markers (handler.Permanent(&net.OpError{…}) is reported as *net.OpError).
// Permanent(nil), Decode(nil), RetryAfter(nil, d) and HTTPStatus(nil, code)
// return nil, so `return handler.Permanent(err)` is safe when err is nil.
//
// # Middleware
//
// A [Middleware] is func(Handler) Handler, as in net/http. [Chain] applies
// several; the first listed is the outermost:
//
//	wrapped := handler.Chain(h, logging, tracing, handler.Timeout(5*time.Second))
//	// wrapped calls logging, then tracing, then the Timeout, then h
//
// [Timeout] bounds each call: when its deadline passes the handler's ctx is
// cancelled and an error it then returns is reported as kind "timeout"
// (retriable). A cancellation that comes from the parent ctx (revoke,
// shutdown) is passed through unchanged and is never reported as a timeout.
package handler

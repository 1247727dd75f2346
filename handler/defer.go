package handler

import (
	"errors"
	"fmt"
	"time"
)

// MaxDefer is the furthest into the future DeferUntil accepts: 90 days from
// the call. A deferred message waits in PostgreSQL, not in Kafka, so the
// topic's retention does not bound it; the limit catches a wrong unit or a
// wrong year (time.Unix(ms, 0), a date in 2226) before such a message sits
// unseen for ever.
const MaxDefer = 90 * 24 * time.Hour

// errDeferTooFar is wrapped by the error DeferUntil returns for a time
// more than MaxDefer away. That error is Permanent: returned from a
// handler, the message is dead-lettered at once (kind permanent) with a
// message naming the time asked for and the limit.
var errDeferTooFar = errors.New("handler: defer beyond MaxDefer")

// deferError asks the consumer to store the message and deliver it again at
// Until, without holding its partition meanwhile. DeferUntil makes
// it; find it in an error chain with DeferredUntil.
type deferError struct {
	// Until is when the message is to be delivered again, as the handler
	// asked. Zero or a time already past means as soon as possible.
	Until time.Time
}

// Error describes the request in one line.
func (e *deferError) Error() string {
	if e.Until.IsZero() {
		return "handler: deferred (deliver again as soon as possible)"
	}
	return "handler: deferred until " + e.Until.UTC().Format(time.RFC3339Nano)
}

// DeferUntil asks for the message to be handled again at t instead of now,
// for waits of minutes to days ("capture the payment 24 hours after
// authorisation", "retry the settlement file at 06:00"). Return it from
// Handle:
//
//	if !windowOpen(now) {
//		return handler.DeferUntil(nextWindow)
//	}
//
// It is not a failure: no retry is spent, nothing goes to a retry tier or
// the DLQ, and the handler's transaction is rolled back as for any error, so
// the inbox records nothing for the message's idempotency key. The consumer
// stores the record (key, value, headers, idempotency key and origin) in
// PostgreSQL (package schedule) in one transaction with the message's
// outcome, commits its offset at once, and the group's scheduler publishes
// it again when t comes by the database's clock. The copy is then handled
// like a new delivery of the same message: same idempotency key, same
// Message.Origin, so a handler that defers again, or a copy published twice
// after a scheduler crash, still has its effects once.
//
// A zero t, or one already past, means as soon as possible: the message is
// stored and published again at once (it still goes through the scheduler,
// so the partition is not held). A t more than MaxDefer from now is refused:
// DeferUntil then returns a Permanent error ("handler: defer beyond
// MaxDefer: …"), which dead-letters the message with that reason if the
// handler returns it.
//
// The wait is not exact: the copy goes out within a scheduler round of t
// (milliseconds) when a scheduler runs, and is consumed behind whatever its
// partition holds then. The time is absolute and the scheduler reads the
// database's clock: a skew between the application's clock and the
// database's shifts a DeferUntil(time.Now().Add(d)) by as much.
func DeferUntil(t time.Time) error {
	return deferUntil(t, time.Now())
}

func deferUntil(t, now time.Time) error {
	if !t.IsZero() && t.Sub(now) > MaxDefer {
		return tooFar(t.UTC().Format(time.RFC3339))
	}
	return &deferError{Until: t}
}

func tooFar(what string) error {
	return Permanent(fmt.Errorf("%w: deferred until %s, more than %s (MaxDefer) away", errDeferTooFar, what, MaxDefer))
}

// DeferredUntil reports whether err (or an error it wraps) asks for the
// message to be deferred (DeferUntil), and until when (zero: as soon
// as possible). The consumer checks it before classifying err as a failure.
func DeferredUntil(err error) (time.Time, bool) {
	var d *deferError
	if errors.As(err, &d) {
		return d.Until, true
	}
	return time.Time{}, false
}

package handler

import (
	"errors"
	"fmt"
	"time"
)

// Kind classifies why a message failed. It is written to the idem-error-kind
// header of forwarded records.
type Kind string

// The kinds of failure. The zero Kind means "no failure".
const (
	KindRetriable  Kind = "retriable"   // an ordinary error: retried in process, then in retry tiers
	KindPermanent  Kind = "permanent"   // Permanent(err): dead-lettered at once
	KindPanic      Kind = "panic"       // the handler panicked
	KindMissingKey Kind = "missing-key" // no idempotency key (absent or empty)
	KindInvalidKey Kind = "invalid-key" // a key that is not valid UTF-8, holds a NUL, or is too long
	KindDecode     Kind = "decode"      // Decode(err): the payload cannot be decoded (poison bytes)
	KindTimeout    Kind = "timeout"     // the handler exceeded its Timeout
	// KindExpired: past its idem-deadline or its topic's maximum age; never handled.
	KindExpired Kind = "expired"
	// KindInvalidHeader: a header idem reads (idem-deadline) is not valid; never handled.
	KindInvalidHeader Kind = "invalid-header"
)

type permanentError struct{ err error }

// Error describes the failure in one line.
func (e *permanentError) Error() string { return e.err.Error() }

// Unwrap returns the wrapped error.
func (e *permanentError) Unwrap() error { return e.err }

// IdemMarked returns the wrapped error: the mark is handler's own, and the
// idem-error-type header names what it wraps (internal/wire.Cause).
func (e *permanentError) IdemMarked() error { return e.err }

// Permanent marks err as not worth retrying: the message goes to the dead-letter
// topic at once (kind "permanent"). Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err or any error it wraps was marked by Permanent
// or Decode.
func IsPermanent(err error) bool {
	var p *permanentError
	var d *decodeError
	return errors.As(err, &p) || errors.As(err, &d)
}

type decodeError struct{ err error }

// Error describes the failure in one line.
func (e *decodeError) Error() string { return "decode: " + e.err.Error() }

// Unwrap returns the wrapped error.
func (e *decodeError) Unwrap() error { return e.err }

// IdemMarked returns the wrapped error (see permanentError.IdemMarked).
func (e *decodeError) IdemMarked() error { return e.err }

// Decode marks err as a failure to decode the payload. It is permanent and is
// dead-lettered with kind "decode"; the record's bytes are kept unchanged.
// Decode(nil) returns nil.
func Decode(err error) error {
	if err == nil {
		return nil
	}
	return &decodeError{err}
}

// IsDecode reports whether err or any error it wraps was marked by Decode.
func IsDecode(err error) bool {
	var d *decodeError
	return errors.As(err, &d)
}

// retryAfterError asks for the message to be retried no sooner than After.
type retryAfterError struct {
	Err   error         // the failure
	After time.Duration // the least delay before the next attempt
}

// Error describes the failure in one line.
func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %s)", e.Err, e.After)
}

// Unwrap returns the wrapped error.
func (e *retryAfterError) Unwrap() error { return e.Err }

// IdemMarked returns the wrapped error (see permanentError.IdemMarked).
func (e *retryAfterError) IdemMarked() error { return e.Err }

// RetryAfter marks err as retriable no sooner than d from now; the in-process
// retry waits at least d (instead of its own backoff). RetryAfter(nil, d)
// returns nil.
//
// When the message is forwarded to a retry tier, d is capped at the delay of
// that tier (retrytopic.Policy.Delays): the record is due exactly the tier's
// delay after the failure, never earlier and never later, whatever d is. So
// due times within one tier stay in the order records were written, and one
// record cannot hold a tier partition for longer than the tier's delay. Give
// the tiers delays that cover the waits your dependencies ask for.
func RetryAfter(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &retryAfterError{Err: err, After: d}
}

// RetryAfterOf returns the delay asked for by RetryAfter anywhere in err's chain.
func RetryAfterOf(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.After, true
	}
	return 0, false
}

// statusError is a dependency's HTTP answer as an error: the status code it
// returned and the failure. It changes nothing in how the consumer treats the
// error (its kind is that of Err: retriable unless marked otherwise); it lets
// a recoverability rule match the status (package recovery, HTTPStatus).
type statusError struct {
	Code int   // the HTTP status code, e.g. 422
	Err  error // the failure
}

// Error describes the failure in one line.
func (e *statusError) Error() string { return fmt.Sprintf("%v (HTTP %d)", e.Err, e.Code) }

// Unwrap returns the wrapped error.
func (e *statusError) Unwrap() error { return e.Err }

// IdemMarked returns the wrapped error (see permanentError.IdemMarked).
func (e *statusError) IdemMarked() error { return e.Err }

// HTTPStatus returns the status code, so that recovery's HTTPStatus rules
// find it.
func (e *statusError) HTTPStatus() int { return e.Code }

// HTTPStatus marks err as a dependency's HTTP answer with status code. The
// result keeps err's message, kind and chain. HTTPStatus(nil, code) returns
// nil.
func HTTPStatus(err error, code int) error {
	if err == nil {
		return nil
	}
	return &statusError{Code: code, Err: err}
}

// PanicError is the error a handler's panic becomes: consumer.Run recovers
// it (a panic in a middleware it was given too) with the goroutine's stack,
// and its kind is "panic".
type PanicError struct {
	Value any    // the value passed to panic
	Stack []byte // the goroutine's stack at the panic
}

// Error describes the failure in one line.
func (e *PanicError) Error() string { return fmt.Sprintf("handler panic: %v", e.Value) }

// Unwrap returns the panic value when it is an error.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// ErrTimeout is wrapped by the error Timeout returns when the handler ran out of
// time.
var ErrTimeout = errors.New("handler: timeout")

// MissingKeyError reports a message without a valid idempotency key.
// Invalid is set when a key was found but cannot be used (not valid UTF-8,
// a NUL byte, longer than the limit): its kind is then KindInvalidKey,
// otherwise KindMissingKey.
type MissingKeyError struct {
	Reason  string // e.g. "empty", "longer than 256 bytes"
	Invalid bool   // a key was there but is unusable
}

// Error describes the failure in one line.
func (e *MissingKeyError) Error() string {
	if e.Invalid {
		return "handler: invalid idempotency key: " + e.Reason
	}
	return "handler: missing idempotency key: " + e.Reason
}

// ExpiredError reports a message the consumer did not hand to its handler
// because it expired (its idem-deadline or its topic's maximum age had
// passed: kind "expired") or because its deadline header is not a time
// (kind "invalid-header"). It is never retried.
type ExpiredError struct {
	Reason        string // e.g. "older than its topic's maximum age 1h0m0s"
	InvalidHeader bool   // the deadline header is not a time
}

// Error describes the failure in one line.
func (e *ExpiredError) Error() string {
	if e.InvalidHeader {
		return "handler: invalid header: " + e.Reason
	}
	return "handler: expired: " + e.Reason
}

// ErrorKind classifies err for routing and for the idem-error-kind header.
// nil gives "". Precedence: expired (or invalid-header), missing-key (or invalid-key), panic, decode, permanent, timeout, then
// retriable.
func ErrorKind(err error) Kind {
	var mk *MissingKeyError
	var ex *ExpiredError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ex):
		if ex.InvalidHeader {
			return KindInvalidHeader
		}
		return KindExpired
	case errors.As(err, &mk):
		if mk.Invalid {
			return KindInvalidKey
		}
		return KindMissingKey
	case errors.As(err, new(*PanicError)):
		return KindPanic
	case IsDecode(err):
		return KindDecode
	case IsPermanent(err):
		return KindPermanent
	case errors.Is(err, ErrTimeout):
		return KindTimeout
	default:
		return KindRetriable
	}
}

// IsRetriable reports whether err should be retried: it is not nil, not
// permanent, not a decode error, not a missing key and not a panic. Context
// errors are retriable (the message is redelivered).
func IsRetriable(err error) bool {
	k := ErrorKind(err)
	return k == KindRetriable || k == KindTimeout
}

// timeoutError is what Timeout returns when the deadline passed.
type timeoutError struct {
	d   time.Duration
	err error
}

// Error describes the failure in one line.
func (e *timeoutError) Error() string {
	return fmt.Sprintf("handler: timeout after %s: %v", e.d, e.err)
}

// Unwrap returns the wrapped error.
func (e *timeoutError) Unwrap() []error { return []error{ErrTimeout, e.err} }

// IdemMarked returns the handler's own error (see permanentError.IdemMarked).
func (e *timeoutError) IdemMarked() error { return e.err }

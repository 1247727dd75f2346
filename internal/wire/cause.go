package wire

// What a handler error carries beyond its class, for idem's own packages:
// the error under package handler's marks (Cause, for the idem-error-type
// header) and an HTTP status (HTTPStatusOf, for recovery's HTTPStatus
// matchers).

import "errors"

// Mark is implemented by package handler's own marks on an error (Permanent,
// Decode, RetryAfter, HTTPStatus, Timeout's error): IdemMarked returns the
// error the mark wraps. Other wrappers (fmt.Errorf's %w, a PanicError, a
// user's own type) do not implement it, and Cause stops at them.
type Mark interface {
	error
	IdemMarked() error
}

// Cause returns the innermost error of err's chain that is not one of
// handler's marks: err itself when it is no Mark, nil for nil. Its type is
// what the idem-error-type header names (fmt's %T), so that
// handler.Permanent(&net.OpError{…}) is reported as *net.OpError, not as
// the mark's own type.
func Cause(err error) error {
	for {
		m, ok := err.(Mark)
		if !ok {
			return err
		}
		err = m.IdemMarked()
	}
}

// HTTPStatusOf returns the HTTP status code carried by the first error in
// err's chain that has a method HTTPStatus() int: an error made by
// handler.HTTPStatus, or an HTTP client's own error type that has such a
// method. It returns 0, false when there is none (and for nil).
func HTTPStatusOf(err error) (int, bool) {
	var s interface{ HTTPStatus() int }
	if errors.As(err, &s) {
		return s.HTTPStatus(), true
	}
	return 0, false
}

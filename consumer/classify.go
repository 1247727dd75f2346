package consumer

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
)

// isPanic reports whether err is or wraps a recovered handler panic.
func isPanic(err error) bool {
	var p *handler.PanicError
	return errors.As(err, &p)
}

// class is what an attempt's error means for the message. Every error an
// attempt can end with (the handler's, the dedupe store's, PostgreSQL's) is
// classified here and nowhere else; forward errors are classified by
// internal/forward.IsPermanentForwardError. The table in doc.go and README's "What
// can go wrong" follow this function.
type class int

const (
	// classDone: no error; the message is processed or a duplicate.
	classDone class = iota
	// classOutage: a dependency is unreachable (the database connection, the
	// dedupe store). The same message is tried again after a backoff; no
	// retry budget is spent, nothing is forwarded. Visible as a stall.
	classOutage
	// classBreaker: a breaker reported its dependency down. Consumption
	// pauses for the cool-down; no retry budget is spent.
	classBreaker
	// classRetriable: the handler failed in a way a later try may not: the
	// retry budget, then the retry tiers, then the dead-letter topic.
	classRetriable
	// classPermanent: no try can succeed: the dead-letter topic at once.
	classPermanent
	// classFatal: the dedupe store is misconfigured (*dedupe.StoreError with
	// Op "config"): every unit of work fails the same way for ever, whatever
	// the message. Run stops and returns the error.
	classFatal
	classDeferred // handler.DeferUntil: not a failure (deferral.go)
	// classExpired: the message's deadline or maximum age passed after
	// decide found it live and before its handler call (a wait at the
	// breaker's gate, for an adaptive lane, for the store's BEGIN or a row
	// lock, for a transaction): the handler was not called, the unit of
	// work rolled back, and the message ends as expired (expiredSince).
	classExpired
)

// errExpiredAtCall is what the store's unit of work returns when the
// message it was about to hand to the handler had expired
// (classExpired).
var errExpiredAtCall = errors.New("consumer: expired before its handler call")

func (c class) String() string {
	return [...]string{"done", "outage", "breaker", "retriable", "permanent", "fatal", "deferred", "expired"}[c]
}

// SQLSTATE classes and codes, by what they mean for the message.
//
// Outages (the server or the connection, not the statement):
//
//	08xxx  connection exception           57P01 admin_shutdown
//	57P02  crash_shutdown                 57P03 cannot_connect_now
//	53300  too_many_connections           58xxx system error (I/O)
//	25006  read_only_sql_transaction (a failover left the pool on a replica)
//
// Permanent (the same input fails the same way every time):
//
//	22xxx  data exception (invalid UTF-8 22021, bad input syntax 22P02, …)
//	54xxx  program limit exceeded (a key or row too large to index, …)
//
// Every other SQLSTATE of the handler's own statements (23 integrity, 40 serialization/deadlock, 42 syntax or
// undefined object, 55 lock not available, 57014 query cancelled, XX…) is an
// ordinary handler failure: retried, then tiers, then the DLQ.
func sqlClass(code string) class {
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "58"),
		code == "57P01", code == "57P02", code == "57P03", code == "53300", code == "25006":
		return classOutage
	case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "54"):
		return classPermanent
	}
	return classRetriable
}

// classify decides what err, returned by one attempt (Dedupe.Process around
// the handler), means. It returns the error to record, wrapped in
// handler.Permanent when the class is permanent but the error did not say so
// (an SQL data error), so the forwarded record's idem-error-kind agrees.
//
// The rules, in order:
//  1. nil: done.
//  2. An open breaker (breaker.IsOpen): classBreaker.
//  3. A store that reports its own configuration wrong (*dedupe.StoreError
//     with Op "config") is fatal: Run returns it.
//  4. A handler error that says it is permanent or a decode failure
//     (handler.IsPermanent, handler.IsDecode) is permanent, even when the
//     database connection died under it: the message fails the same way on
//     any connection. This holds for single messages and batches alike.
//  5. A failure of the store's own step (*dedupe.StoreError: BEGIN, the
//     inbox INSERT, COMMIT, a lease claim) is an outage — the same for every
//     message, so no message is to blame: the server is unreachable, the
//     inbox table is missing, the server is read-only after a failover —
//     with two exceptions that depend on the message: an SQL data error or
//     program limit (SQLSTATE 22, 54: its key) is permanent, and a COMMIT the
//     server refused because of the handler's writes (SQLSTATE 23, a deferred
//     constraint; 40, a serialization failure) has a known outcome, rolled
//     back, and is an ordinary handler failure.
//  6. An error of the handler carrying an SQLSTATE (pgconn.PgError) is
//     classified by sqlClass; one raised while the handler's connection died
//     (a *dedupe.StoreError with Op "handler") without an SQLSTATE is an
//     outage.
//  7. Other handler errors by their handler kind: permanent, decode, missing
//     or invalid key, and panics (unless Config.Retry.Panics) are permanent;
//     everything else, timeouts included, is retriable.
func (r *runner) classify(err error) (class, error) { return r.classifyWith(err, r.cfg.Retry.Panics) }

// classifyWith is classify with panics, the Retry.Panics of the message's
// route.
func (r *runner) classifyWith(err error, panics bool) (class, error) {
	if err == nil {
		return classDone, nil
	}
	if _, ok := handler.DeferredUntil(err); ok {
		return classDeferred, err
	}
	if errors.Is(err, errExpiredAtCall) {
		return classExpired, err
	}
	if breaker.IsOpen(err) {
		return classBreaker, err
	}
	var se *dedupe.StoreError
	isStore := errors.As(err, &se)
	if isStore && se.Op == "config" {
		return classFatal, err
	}
	if handler.IsPermanent(err) || handler.IsDecode(err) {
		return classPermanent, err
	}
	var pe *pgconn.PgError
	sql := errors.As(err, &pe)
	if isStore && se.Op != "handler" {
		switch {
		case sql && sqlClass(pe.Code) == classPermanent:
			return classPermanent, handler.Permanent(err)
		case sql && se.Op == "commit" && (strings.HasPrefix(pe.Code, "23") || strings.HasPrefix(pe.Code, "40")):
			return classRetriable, err
		}
		return classOutage, err
	}
	if sql {
		switch sqlClass(pe.Code) {
		case classOutage:
			return classOutage, err
		case classPermanent:
			return classPermanent, handler.Permanent(err)
		}
		return classRetriable, err
	}
	if isStore { // the handler's connection died, no SQLSTATE
		return classOutage, err
	}
	if isPanic(err) && panics {
		return classRetriable, err
	}
	if handler.IsRetriable(err) {
		return classRetriable, err
	}
	return classPermanent, err
}

package recovery

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
)

// Matcher says whether a rule applies to an error. Build one with Is, As,
// Kind, SQLState, HTTPStatus, HTTPStatusRange, Func or AnyOf; the zero Matcher
// matches nothing and New rejects a rule that has it. A Matcher built from bad
// arguments (an unknown kind, a malformed SQLSTATE) matches nothing either, and
// New reports the problem with the rule's index. Matchers are values, safe for
// concurrent use; they look through the whole Unwrap chain of the error,
// wrapped with fmt.Errorf("…: %w") or by handler's markers.
type Matcher struct {
	desc  string
	match func(error) bool
	err   error // what was wrong with the arguments; reported by New
}

// Match reports whether m matches err. It is false for a nil err, for the zero
// Matcher and for one built from bad arguments.
func (m Matcher) Match(err error) bool {
	if err == nil || m.match == nil || m.err != nil {
		return false
	}
	return m.match(err)
}

// String describes m, as in Is(bank.ErrFraud) or SQLState(23, 40001).
func (m Matcher) String() string {
	if m.desc == "" {
		return "no matcher"
	}
	return m.desc
}

// check returns the problem with m, if any.
func (m Matcher) check() error {
	if m.match == nil && m.err == nil {
		return errors.New("has no matcher (Match is the zero Matcher): use recovery.Is, As, Kind, SQLState, HTTPStatus or Func")
	}
	if m.err != nil {
		return fmt.Errorf("%s: %w", m.desc, m.err)
	}
	return nil
}

func bad(desc string, format string, args ...any) Matcher {
	return Matcher{desc: desc, err: fmt.Errorf(format, args...)}
}

// Is matches errors for which errors.Is(err, target) holds: a sentinel such
// as bank.ErrFraudDeclined, wrapped anywhere in the chain. target must not be
// nil.
func Is(target error) Matcher {
	desc := fmt.Sprintf("Is(%v)", target)
	if target == nil {
		return bad("Is(nil)", "the target error is nil")
	}
	return Matcher{desc: desc, match: func(err error) bool { return errors.Is(err, target) }}
}

// As matches errors whose chain holds an error of type T (errors.As), e.g.
// As[*bank.DeclineError]() or an interface type such as As[net.Error]().
func As[T error]() Matcher {
	return Matcher{
		desc: "As[" + reflect.TypeFor[T]().String() + "]",
		match: func(err error) bool {
			var t T
			return errors.As(err, &t)
		},
	}
}

// kinds are the kinds handler.ErrorKind can return for a handler's error.
var kinds = []handler.Kind{
	handler.KindRetriable, handler.KindPermanent, handler.KindPanic, handler.KindMissingKey,
	handler.KindInvalidKey, handler.KindDecode, handler.KindTimeout,
}

// Kind matches errors whose failure kind (handler.ErrorKind, the
// idem-error-kind header of a forwarded record) is one of ks: e.g.
// Kind(handler.KindTimeout) gives timeouts more patience. ks must not be empty
// and must hold only handler's kinds.
func Kind(ks ...handler.Kind) Matcher {
	names := make([]string, len(ks))
	for i, k := range ks {
		names[i] = string(k)
	}
	desc := "Kind(" + strings.Join(names, ", ") + ")"
	if len(ks) == 0 {
		return bad(desc, "no kind given")
	}
	for _, k := range ks {
		if !slices.Contains(kinds, k) {
			return bad(desc, "unknown kind %q: handler's kinds are %v", k, kinds)
		}
	}
	ks = slices.Clone(ks)
	return Matcher{desc: desc, match: func(err error) bool { return slices.Contains(ks, handler.ErrorKind(err)) }}
}

// SQLState matches errors carrying a PostgreSQL error (*pgconn.PgError, as
// pgx returns it) whose SQLSTATE is one of codes: a class of two characters
// ("23" integrity constraint violation, "40" transaction rollback) or a full
// code of five ("23505" unique_violation, "40P01" deadlock). Each code is
// made of digits and upper-case letters; codes must not be empty.
func SQLState(codes ...string) Matcher {
	desc := "SQLState(" + strings.Join(codes, ", ") + ")"
	if len(codes) == 0 {
		return bad(desc, "no SQLSTATE class or code given")
	}
	for _, c := range codes {
		if len(c) != 2 && len(c) != 5 {
			return bad(desc, "%q is neither a class (2 characters, e.g. \"23\") nor a code (5, e.g. \"23505\")", c)
		}
		for _, r := range c {
			if !(r >= '0' && r <= '9' || r >= 'A' && r <= 'Z') {
				return bad(desc, "%q has %q: SQLSTATEs are digits and upper-case letters", c, r)
			}
		}
	}
	codes = slices.Clone(codes)
	return Matcher{desc: desc, match: func(err error) bool {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) {
			return false
		}
		for _, c := range codes {
			if strings.HasPrefix(pe.Code, c) {
				return true
			}
		}
		return false
	}}
}

// HTTPStatus matches errors carrying one of the HTTP status codes: the code
// of the first error in the chain with an HTTPStatus() int method, such as a
// handler.HTTPStatus(err, code) or an HTTP client's own error type. Each code must be in 100…599; codes must not
// be empty.
func HTTPStatus(codes ...int) Matcher {
	desc := fmt.Sprintf("HTTPStatus%v", codes)
	if len(codes) == 0 {
		return bad(desc, "no status code given")
	}
	for _, c := range codes {
		if c < 100 || c > 599 {
			return bad(desc, "%d is not an HTTP status (100…599)", c)
		}
	}
	codes = slices.Clone(codes)
	return Matcher{desc: desc, match: func(err error) bool {
		code, ok := wire.HTTPStatusOf(err)
		return ok && slices.Contains(codes, code)
	}}
}

// HTTPStatusRange matches errors carrying an HTTP status code in lo…hi
// (inclusive), e.g. HTTPStatusRange(400, 499) for every client error. The
// range must lie in 100…599 with lo <= hi.
func HTTPStatusRange(lo, hi int) Matcher {
	desc := fmt.Sprintf("HTTPStatusRange(%d, %d)", lo, hi)
	if lo < 100 || hi > 599 || lo > hi {
		return bad(desc, "want 100 <= lo <= hi <= 599")
	}
	return Matcher{desc: desc, match: func(err error) bool {
		code, ok := wire.HTTPStatusOf(err)
		return ok && code >= lo && code <= hi
	}}
}

// Func matches errors for which fn returns true; name describes it in errors
// and logs. fn must not be nil, must be safe for concurrent use, and is never
// called with a nil error.
func Func(name string, fn func(err error) bool) Matcher {
	desc := "Func(" + name + ")"
	if fn == nil {
		return bad(desc, "the match function is nil")
	}
	return Matcher{desc: desc, match: fn}
}

// AnyOf matches errors that any of ms matches. ms must not be empty, and each
// must be valid.
func AnyOf(ms ...Matcher) Matcher {
	descs := make([]string, len(ms))
	for i, m := range ms {
		descs[i] = m.String()
	}
	desc := "AnyOf(" + strings.Join(descs, ", ") + ")"
	if len(ms) == 0 {
		return bad(desc, "no matcher given")
	}
	for i, m := range ms {
		if err := m.check(); err != nil {
			return bad(desc, "matcher %d: %w", i, err)
		}
	}
	ms = slices.Clone(ms)
	return Matcher{desc: desc, match: func(err error) bool {
		for _, m := range ms {
			if m.Match(err) {
				return true
			}
		}
		return false
	}}
}

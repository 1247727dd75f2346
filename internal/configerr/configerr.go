// Package configerr is the one idiom idem's config types validate with:
// Validate collects every problem, each naming the field, its value and the
// rule it breaks, and returns them at once (errors.Join), every one matching
// the package's sentinel (outbox.ErrInvalidConfig, schedule.ErrInvalidConfig…)
// through errors.Is; a package whose constructor returns no other error
// keeps its sentinel unexported, as a prefix. It is consumer.Config's idiom, for the other packages.
package configerr

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
)

// Error is one bad field: its value breaks Rule (List.Bad), or another check
// of it failed with Err (List.Check).
type Error struct {
	Sentinel error  // the package's ErrInvalid… sentinel; errors.Is matches it
	Field    string // e.g. "Relay.BatchSize"
	Value    any    // the offending value; unset with Err
	Rule     string // e.g. "must be >= 0"; empty with Err
	Err      error  // the verdict of another check on Field (List.Check), or nil
}

// Error reads "<sentinel>: <Field> = <Value>: <Rule>", or
// "<sentinel>: <Field>: <Err>" for another check's verdict.
func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%v: %s: %v", e.Sentinel, e.Field, e.Err)
	}
	v := e.Value
	if s, ok := v.(string); ok {
		v = fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%v: %s = %v: %s", e.Sentinel, e.Field, v, e.Rule)
}

// Is reports whether target is the package's sentinel.
func (e *Error) Is(target error) bool { return target == e.Sentinel }

// Unwrap returns Err, so errors.Is and errors.As see the other check's
// verdict too.
func (e *Error) Unwrap() error { return e.Err }

// List collects the problems of one configuration. The zero List is not
// usable: make one with New.
type List struct {
	sentinel error
	prefix   string
	errs     []error
}

// New returns an empty List whose errors match sentinel and whose field
// names start with prefix ("Relay." for the fields of Relay; "" for none).
func New(sentinel error, prefix string) *List {
	return &List{sentinel: sentinel, prefix: prefix}
}

// Bad records that field has value v, which breaks rule.
func (l *List) Bad(field string, v any, rule string) {
	l.errs = append(l.errs, &Error{Sentinel: l.sentinel, Field: l.prefix + field, Value: v, Rule: rule})
}

// Check records err, the verdict of another check on field (a sarama
// config's Validate, a nested value's), if it is not nil, as an *Error whose
// Err is err: it matches both the sentinel and err.
func (l *List) Check(field string, err error) {
	if err != nil {
		l.errs = append(l.errs, &Error{Sentinel: l.sentinel, Field: l.prefix + field, Err: err})
	}
}

// NonNegative records every field of durations (field name → value) whose
// value is negative, in field-name order: a zero duration selects the
// field's default, a negative one is a mistake.
func (l *List) NonNegative(durations map[string]time.Duration) {
	for _, field := range slices.Sorted(maps.Keys(durations)) {
		if d := durations[field]; d < 0 {
			l.Bad(field, d, "must be >= 0 (0: the default)")
		}
	}
}

// Add records err, if it is not nil, as it is: a problem another check
// reported in full (it names the field and wraps the sentinel already).
func (l *List) Add(err error) {
	if err != nil {
		l.errs = append(l.errs, err)
	}
}

// Err returns every recorded problem joined (errors.Join), or nil if there
// is none.
func (l *List) Err() error { return errors.Join(l.errs...) }

package coremetrics

// Registering Prometheus collectors so that several components of one
// process may share a registry: the collector already registered under the
// same description is reused instead of failing. Every package of idem that
// owns collectors registers them through Register.

import (
	"errors"
	"reflect"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns it, or returns the collector of
// the same description reg already holds (a second consumer, relay,
// orchestrator or runner on the same registry). Any other error is kept in
// *errp when *errp is still nil, and c is returned, so that a constructor
// can register all its collectors and report the first failure once.
//
// A nil reg, or a nil pointer in it (a *prometheus.Registry left nil, as
// "no metrics"), registers nothing: c is returned and works, unexported.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T, errp *error) T {
	if IsNil(reg) {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing
			}
		}
		if *errp == nil {
			*errp = err
		}
	}
	return c
}

// IsNil reports whether reg is nil or holds a nil pointer (or other nil
// value), on which Register would panic.
func IsNil(reg prometheus.Registerer) bool {
	if reg == nil {
		return true
	}
	switch v := reflect.ValueOf(reg); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return v.IsNil()
	}
	return false
}

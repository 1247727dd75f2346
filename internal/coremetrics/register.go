package coremetrics

// Registering Prometheus collectors so that several components of one
// process may share a registry: the collector already registered under the
// same description is reused instead of failing. Every package of idem that
// owns collectors registers them through Register.

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns it, or returns the collector of
// the same description reg already holds (a second consumer, relay,
// orchestrator or runner on the same registry). Any other error is kept in
// *errp when *errp is still nil, and c is returned, so that a constructor
// can register all its collectors and report the first failure once.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T, errp *error) T {
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

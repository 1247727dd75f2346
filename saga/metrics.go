package saga

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/coremetrics"
)

// collectors is the set of the saga orchestrator's collectors (the
// idem_saga_* rows of the table in package metrics' doc). Labels are bounded: the saga type
// and the step name come from code, never from data; saga ids are never
// labels. Use newCollectors; all methods are safe for concurrent use.
type collectors struct {
	Transitions          *prometheus.CounterVec   // idem_saga_transitions_total
	StepDuration         *prometheus.HistogramVec // idem_saga_step_duration_seconds
	Compensations        *prometheus.CounterVec   // idem_saga_compensations_total
	CompensationDuration *prometheus.HistogramVec // idem_saga_compensation_duration_seconds
}

// stepBuckets covers in-process calls (milliseconds) up to slow remote
// services (tens of seconds).
var stepBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// newCollectors creates the saga collectors and registers them on reg. A nil reg
// registers nothing (the collectors still work, unexported). Registering on a
// registry that already holds them reuses the existing collectors, so several
// orchestrators may share one registry.
func newCollectors(reg prometheus.Registerer) (*collectors, error) {
	m := &collectors{
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_saga_transitions_total",
			Help: "Sagas entering a state (running, waiting, compensating, completed, compensated)."}, []string{"type", "state"}),
		StepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_saga_step_duration_seconds",
			Help: "Saga step action latency by result (ok, pending, error, outage).", Buckets: stepBuckets}, []string{"type", "step", "result"}),
		Compensations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_saga_compensations_total",
			Help: "Saga compensation calls by result (ok, error); errors are retried with backoff."}, []string{"type", "step", "result"}),
		CompensationDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_saga_compensation_duration_seconds",
			Help: "Saga compensation call latency.", Buckets: stepBuckets}, []string{"type", "step"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Transitions = coremetrics.Register(reg, m.Transitions, &err)
	m.StepDuration = coremetrics.Register(reg, m.StepDuration, &err)
	m.Compensations = coremetrics.Register(reg, m.Compensations, &err)
	m.CompensationDuration = coremetrics.Register(reg, m.CompensationDuration, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

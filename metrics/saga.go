package metrics

import "github.com/prometheus/client_golang/prometheus"

// Saga is the set of the saga orchestrator's collectors (package saga; the
// idem_saga_* rows of the table in doc.go). Labels are bounded: the saga type
// and the step name come from code, never from data; saga ids are never
// labels. Use NewSaga; all methods are safe for concurrent use.
type Saga struct {
	Transitions          *prometheus.CounterVec   // idem_saga_transitions_total
	StepDuration         *prometheus.HistogramVec // idem_saga_step_duration_seconds
	Compensations        *prometheus.CounterVec   // idem_saga_compensations_total
	CompensationDuration *prometheus.HistogramVec // idem_saga_compensation_duration_seconds
}

// stepBuckets covers in-process calls (milliseconds) up to slow remote
// services (tens of seconds).
var stepBuckets = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// NewSaga creates the saga collectors and registers them on reg. A nil reg
// registers nothing (the collectors still work, unexported). Registering on a
// registry that already holds them reuses the existing collectors, so several
// orchestrators may share one registry.
func NewSaga(reg prometheus.Registerer) (*Saga, error) {
	m := &Saga{
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
	m.Transitions = register(reg, m.Transitions, &err)
	m.StepDuration = register(reg, m.StepDuration, &err)
	m.Compensations = register(reg, m.Compensations, &err)
	m.CompensationDuration = register(reg, m.CompensationDuration, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

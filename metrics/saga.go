package metrics

import "github.com/prometheus/client_golang/prometheus"

// Saga metric names (package saga). Labels are bounded: the saga type and the
// step name come from code, never from data; saga ids are never labels.
//
//	idem_saga_transitions_total{type,state}              sagas entering a state: running, waiting, compensating, completed, compensated
//	idem_saga_step_duration_seconds{type,step,result}    step action calls: ok, pending, error, outage (breaker open)
//	idem_saga_compensations_total{type,step,result}      compensation calls: ok, error (each error is retried with backoff)
//	idem_saga_compensation_duration_seconds{type,step}   compensation call latency
const (
	SagaTransitionsName          = "idem_saga_transitions_total"
	SagaStepDurationName         = "idem_saga_step_duration_seconds"
	SagaCompensationsName        = "idem_saga_compensations_total"
	SagaCompensationDurationName = "idem_saga_compensation_duration_seconds"
)

// Saga is the set of the saga orchestrator's collectors. Use NewSaga; all
// methods are safe for concurrent use.
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
		Transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: SagaTransitionsName,
			Help: "Sagas entering a state (running, waiting, compensating, completed, compensated)."}, []string{"type", "state"}),
		StepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: SagaStepDurationName,
			Help: "Saga step action latency by result (ok, pending, error, outage).", Buckets: stepBuckets}, []string{"type", "step", "result"}),
		Compensations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: SagaCompensationsName,
			Help: "Saga compensation calls by result (ok, error); errors are retried with backoff."}, []string{"type", "step", "result"}),
		CompensationDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: SagaCompensationDurationName,
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

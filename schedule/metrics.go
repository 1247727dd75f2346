package schedule

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the scheduler's collectors, all labelled by consumer group:
//
//	idem_schedule_pending{group}                  gauge    deferred records waiting (due or not), refreshed by the leader every StatsInterval
//	idem_schedule_published_total{group}          counter  deferred records published and acknowledged by Kafka
//	idem_schedule_publish_failures_total{group}   counter  failed publishes (each retried with backoff)
//	idem_schedule_leader{group}                   gauge    1 while this process's scheduler leads the group
//
// A consumer counts the records it defers itself (idem_deferred_total in
// package metrics, when wired).
type metrics struct {
	Pending         *prometheus.GaugeVec
	Published       *prometheus.CounterVec
	PublishFailures *prometheus.CounterVec
	Leader          *prometheus.GaugeVec
}

// newMetrics makes the scheduler's collectors and registers them on reg
// (nil: kept, not exported). Collectors already registered on reg by an
// earlier call (another Scheduler on the same registry) are shared, not an
// error. Scheduler.Run calls it with Scheduler.Registerer.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	group := []string{"group"}
	m := &metrics{
		Pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_schedule_pending",
			Help: "Deferred records waiting to be published, due or not (refreshed by the leader)."}, group),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_schedule_published_total",
			Help: "Deferred records published when due and acknowledged by Kafka."}, group),
		PublishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_schedule_publish_failures_total",
			Help: "Failed publishes of due deferred records (each retried with backoff)."}, group),
		Leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_schedule_leader",
			Help: "1 while this process's scheduler holds the group's lock, else 0."}, group),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	m.Pending = registerOrShare(reg, m.Pending, &errs)
	m.Published = registerOrShare(reg, m.Published, &errs)
	m.PublishFailures = registerOrShare(reg, m.PublishFailures, &errs)
	m.Leader = registerOrShare(reg, m.Leader, &errs)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// registerOrShare registers c, or returns the collector of the same
// description reg already has.
func registerOrShare[T prometheus.Collector](reg prometheus.Registerer, c T, errs *[]error) T {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	switch {
	case err == nil:
		return c
	case errors.As(err, &are):
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing
		}
	}
	*errs = append(*errs, err)
	return c
}

package schedule

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/coremetrics"
)

// metrics are the scheduler's collectors, all labelled by consumer group:
//
//	idem_schedule_pending{group}                  gauge    deferred records waiting (due or not), refreshed by the leader every StatsInterval
//	idem_schedule_published_total{group}          counter  deferred records published and acknowledged by Kafka
//	idem_schedule_publish_failures_total{group}   counter  failed publishes (each retried with backoff)
//	idem_schedule_leader{group}                   gauge    1 while this process's scheduler leads the group
//	idem_schedule_dead_lettered_total{group}      counter  deferred records whose sealed payload could not be opened for good (data key destroyed), dead-lettered as stubs
//
// A consumer counts the records it defers itself (idem_deferred_total in
// package metrics, when wired).
type metrics struct {
	Pending         *prometheus.GaugeVec
	Published       *prometheus.CounterVec
	PublishFailures *prometheus.CounterVec
	Leader          *prometheus.GaugeVec
	DeadLettered    *prometheus.CounterVec
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
		DeadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_schedule_dead_lettered_total",
			Help: "Deferred records whose sealed payload could not be opened for good (data key destroyed), sent to the dead-letter topic as stubs instead."}, group),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Pending = coremetrics.Register(reg, m.Pending, &err)
	m.Published = coremetrics.Register(reg, m.Published, &err)
	m.PublishFailures = coremetrics.Register(reg, m.PublishFailures, &err)
	m.Leader = coremetrics.Register(reg, m.Leader, &err)
	m.DeadLettered = coremetrics.Register(reg, m.DeadLettered, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

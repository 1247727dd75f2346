package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/coremetrics"
)

// The outbox relay's metrics (package outbox), all labelled by table:
//
//	idem_outbox_pending{table}                          rows waiting to be published, delayed ones included
//	idem_outbox_oldest_pending_seconds{table}           how long the oldest publishable row has waited (below); 0 when none
//	idem_outbox_failed{table}                           rows in the failed state (`idem outbox list --failed`)
//	idem_outbox_published_total{table}                  rows published and acknowledged by Kafka
//	idem_outbox_publish_seconds{table}                  row insert (≈ commit), or its NotBefore when later → Kafka ack latency, histogram
//	idem_outbox_publish_failures_total{table,reason}    refused or failed publishes, by reason
//	idem_outbox_leader{table}                           1 while this relay holds the table's lock, else 0
//
// The gauges pending, oldest and failed are refreshed by the leader only,
// every Relay.StatsInterval (5 s by default). The oldest pending row is
// timed from its insert, or from its NotBefore (outbox.Message) when that is
// later, and only among the rows the relay may publish now: rows delayed to
// a time that has not come, and rows held back behind an earlier waiting row
// of their key (a delayed or retried one), are left out, as they wait by
// design; the holder itself counts once it is due. The gauge thus measures
// the relay's delay, which is what an alert should watch (IdemOutboxStuck),
// never a delay the application asked for.

// collectors is the set of the relay's collectors. The zero value is not usable;
// use newCollectors. All methods are safe for concurrent use.
type collectors struct {
	Pending         *prometheus.GaugeVec     // idem_outbox_pending
	OldestPending   *prometheus.GaugeVec     // idem_outbox_oldest_pending_seconds
	Failed          *prometheus.GaugeVec     // idem_outbox_failed
	Published       *prometheus.CounterVec   // idem_outbox_published_total
	PublishSeconds  *prometheus.HistogramVec // idem_outbox_publish_seconds
	PublishFailures *prometheus.CounterVec   // idem_outbox_publish_failures_total
	Leader          *prometheus.GaugeVec     // idem_outbox_leader
}

// newCollectors creates the relay's collectors and registers them on reg. A nil
// reg registers nothing. Registering twice on one registry reuses the
// collectors already there (two relays of different tables, or a relay inside
// a consumer, may share a registry).
func newCollectors(reg prometheus.Registerer) (*collectors, error) {
	table := []string{"table"}
	m := &collectors{
		Pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_outbox_pending",
			Help: "Outbox rows waiting to be published, delayed ones included (refreshed by the leader)."}, table),
		OldestPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_outbox_oldest_pending_seconds",
			Help: "Seconds the oldest outbox row the relay may publish now has waited, from its insert or its NotBefore when later (rows delayed to a later time, and rows held back behind them on their key, are left out); 0 when none."}, table),
		Failed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_outbox_failed",
			Help: "Outbox rows in the failed state, waiting for `idem outbox retry`."}, table),
		Published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_outbox_published_total",
			Help: "Outbox rows published and acknowledged by Kafka."}, table),
		PublishSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_outbox_publish_seconds",
			Help:    "Latency from an outbox row's insert (about its commit), or its NotBefore when later, to Kafka's acknowledgement.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, table),
		PublishFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_outbox_publish_failures_total",
			Help: "Failed outbox publishes by reason: unknown_topic, too_large, authorization, other."}, []string{"table", "reason"}),
		Leader: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_outbox_leader",
			Help: "1 while this process's relay holds the table's advisory lock, else 0."}, table),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Pending = coremetrics.Register(reg, m.Pending, &err)
	m.OldestPending = coremetrics.Register(reg, m.OldestPending, &err)
	m.Failed = coremetrics.Register(reg, m.Failed, &err)
	m.Published = coremetrics.Register(reg, m.Published, &err)
	m.PublishSeconds = coremetrics.Register(reg, m.PublishSeconds, &err)
	m.PublishFailures = coremetrics.Register(reg, m.PublishFailures, &err)
	m.Leader = coremetrics.Register(reg, m.Leader, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

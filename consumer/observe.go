package consumer

import (
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"
)

// partObs holds a claimed partition's end-to-end latency and in-flight
// collectors, shared by the claim's workers.
type partObs struct {
	e2e      prometheus.Observer // idem_end_to_end_seconds{group,topic}
	inflight prometheus.Gauge    // idem_messages_in_flight{group,topic}
	flight   atomic.Int64        // this claim's share of inflight
}

func newPartObs(r *runner, topic string) *partObs {
	return &partObs{
		e2e:      r.m.EndToEnd.WithLabelValues(r.cfg.Group, topic),
		inflight: r.m.InFlight.WithLabelValues(r.cfg.Group, topic),
	}
}

// taken counts a message taken from the partition's queue as in flight.
func (o *partObs) taken() {
	o.flight.Add(1)
	o.inflight.Inc()
}

// marked records a message's final outcome at now: it leaves the in-flight
// count and its end-to-end latency (record timestamp to now) is observed. A
// record without a timestamp (before Kafka 0.10's format) is not observed; a
// timestamp ahead of this host's clock counts as 0.
func (o *partObs) marked(m *sarama.ConsumerMessage, now time.Time) {
	o.flight.Add(-1)
	o.inflight.Dec()
	if m.Timestamp.Unix() <= 0 {
		return
	}
	o.e2e.Observe(max(now.Sub(m.Timestamp), 0).Seconds())
}

// close takes the messages still in flight when the claim ended (left for
// redelivery) out of the gauge.
func (o *partObs) close() {
	if n := o.flight.Swap(0); n != 0 {
		o.inflight.Sub(float64(n))
	}
}

package failidx

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector is the collector of the index's gauges, read from its Store at
// every scrape:
//
//	idem_dlq_unresolved{group,topic}                 gauge  records in the index not dealt with: unresolved, and claimed by a replay job not finished (replaying)
//	idem_dlq_oldest_unresolved_seconds{group,topic}  gauge  age of the oldest of those (since its last failure, when it was dead-lettered)
//
// and, where an index.Indexer runs, the retention of each DLQ topic it reads
// (retention.ms), so an alert can compare the two:
//
//	idem_dlq_retention_seconds{topic}                gauge  the DLQ topic's retention.ms in seconds; absent when unlimited or not read yet
//
// A group and topic with no unresolved record has no series. A scrape that
// cannot read the index (within 5 s) reports nothing for it and logs why.
//
// Services do not register it themselves: index.Indexer.Registerer and
// console.Config.Registerer do (through internal/coremetrics), and share one
// collector when given the same Registerer. It is safe for concurrent use.
type Collector struct {
	store *Store
	now   func() time.Time

	mu        sync.Mutex
	retention map[string]time.Duration
}

// NewCollector returns the Collector of the index s reads.
func NewCollector(s *Store) *Collector { return &Collector{store: s, now: time.Now} }

var (
	descUnresolved = prometheus.NewDesc("idem_dlq_unresolved", "Unresolved dead-letter records in the failure index.", []string{"group", "topic"}, nil)
	descOldest     = prometheus.NewDesc("idem_dlq_oldest_unresolved_seconds", "Age of the oldest unresolved dead-letter record, since it was dead-lettered (its last failure).", []string{"group", "topic"}, nil)
	descRetention  = prometheus.NewDesc("idem_dlq_retention_seconds", "Retention of the dead-letter topic (retention.ms), in seconds.", []string{"topic"}, nil)
)

// Describe sends the descriptors of the collector's metrics.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descUnresolved
	ch <- descOldest
	ch <- descRetention
}

// Collect reads the index and sends the current values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.store.db.Query(ctx, `SELECT g.consumer_group, g.dlq_topic, g.unresolved,
			(SELECT min(r.last_failure_at) FROM idem_dlq_records r
			 WHERE r.status IN ('unresolved', 'replaying') AND r.consumer_group = g.consumer_group AND r.dlq_topic = g.dlq_topic)
		FROM (SELECT consumer_group, dlq_topic, sum(unresolved + replaying) AS unresolved FROM idem_dlq_groups GROUP BY consumer_group, dlq_topic) g
		WHERE g.unresolved > 0`)
	if err == nil {
		now := c.now()
		for rows.Next() {
			var group, topic string
			var n int64
			var oldest *time.Time
			if err = rows.Scan(&group, &topic, &n, &oldest); err != nil {
				break
			}
			if oldest == nil { // counted unresolved, gone meanwhile
				continue
			}
			ch <- prometheus.MustNewConstMetric(descUnresolved, prometheus.GaugeValue, float64(n), group, topic)
			ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, max(0, now.Sub(*oldest).Seconds()), group, topic)
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	if err != nil {
		slog.Warn("index: collect idem_dlq_unresolved", "err", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, d := range c.retention {
		ch <- prometheus.MustNewConstMetric(descRetention, prometheus.GaugeValue, d.Seconds(), topic)
	}
}

// SetRetention replaces the retention of the topics in r (the others keep
// theirs): what idem_dlq_retention_seconds reports. The indexer sets it.
func (c *Collector) SetRetention(r map[string]time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.retention == nil {
		c.retention = map[string]time.Duration{}
	}
	for t, d := range r {
		c.retention[t] = d
	}
}

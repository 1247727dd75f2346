package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric sums the samples of the metric family name gathered from g whose
// labels include every pair of want (nil: every sample): a counter's or a
// gauge's value, a histogram's or a summary's sample count. It is 0 when no
// sample matches; MetricFound tells the two apart.
func Metric(tb testing.TB, g prometheus.Gatherer, name string, want map[string]string) float64 {
	tb.Helper()
	v, _ := MetricFound(tb, g, name, want)
	return v
}

// MetricFound is Metric, and whether any sample matched.
func MetricFound(tb testing.TB, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	tb.Helper()
	mfs, err := g.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	found := false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := make(map[string]string, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			found = true
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			case m.Summary != nil:
				sum += float64(m.Summary.GetSampleCount())
			case m.Untyped != nil:
				sum += m.Untyped.GetValue()
			}
		}
	}
	return sum, found
}

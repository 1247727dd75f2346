package breaker

import "github.com/prometheus/client_golang/prometheus"

// NewLimitCollector returns a Prometheus collector that reads
// set.LimitStates at every scrape and exports, for every dependency that has
// limits or was called through Set.Do:
//
//	idem_dependency_rate_limit{dependency}                    gauge    this member's rate limit, calls a second (Limits.Rate × share); 0: none
//	idem_dependency_max_in_flight{dependency}                 gauge    this member's cap of calls in flight (Limits.MaxInFlight × share); 0: none
//	idem_dependency_in_flight{dependency}                     gauge    calls to the dependency running now through Set.Do
//	idem_dependency_throttled_seconds_total{dependency,reason} counter seconds calls waited for a token or a slot (reason "wait", summed over calls) or the dependency was paused by its Retry-After (reason "retry-after")
//	idem_dependency_throttled_total{dependency,reason}         counter Set.Do calls that returned the dependency's *ThrottleError, by ThrottleReason: "rate", "in-flight", "retry-after"
//
// Every series of a dependency is present from its first limit or call on,
// counters at 0 included, so rate() and alerts need no absent() guard. The
// dependency label is the name given to Set.Do and Set.SetLimits, which comes
// from code (keep it bounded: never a URL or an id).
//
// Register it once per Set on a prometheus.Registerer (the consumer's
// Config.Registerer). Two Sets on one registry must not share dependency
// names: their series would collide and the registry reports the error at
// scrape time. The collector is safe for concurrent use.
func NewLimitCollector(set *Set) prometheus.Collector { return &limitCollector{set: set} }

// limitCollector is the prometheus.Collector NewLimitCollector returns.
type limitCollector struct{ set *Set }

var _ prometheus.Collector = (*limitCollector)(nil)

// The label values of idem_dependency_throttled_seconds_total.
const (
	throttledWait       = "wait"
	throttledRetryAfter = string(ReasonRetryAfter)
)

// throttleReasons are the reasons idem_dependency_throttled_total always has.
var throttleReasons = [...]ThrottleReason{ReasonRate, ReasonInFlight, ReasonRetryAfter}

var (
	descRateLimit = prometheus.NewDesc("idem_dependency_rate_limit",
		"This member's rate limit toward the dependency, in calls per second (Limits.Rate times its share); 0 when there is none.",
		[]string{"dependency"}, nil)
	descMaxInFlight = prometheus.NewDesc("idem_dependency_max_in_flight",
		"This member's cap of calls in flight to the dependency (Limits.MaxInFlight times its share); 0 when there is none.",
		[]string{"dependency"}, nil)
	descInFlight = prometheus.NewDesc("idem_dependency_in_flight",
		"Calls to the dependency running now through breaker.Set.Do.",
		[]string{"dependency"}, nil)
	descThrottledSeconds = prometheus.NewDesc("idem_dependency_throttled_seconds_total",
		"Seconds calls waited for a token or a call slot (reason wait, summed over calls), or the dependency was paused by its Retry-After (reason retry-after).",
		[]string{"dependency", "reason"}, nil)
	descThrottled = prometheus.NewDesc("idem_dependency_throttled_total",
		"Calls to the dependency refused without waiting longer or paused, by reason: rate, in-flight, retry-after.",
		[]string{"dependency", "reason"}, nil)
)

// Describe sends the descriptors of the collector's metrics.
func (c *limitCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRateLimit, descMaxInFlight, descInFlight, descThrottledSeconds, descThrottled} {
		ch <- d
	}
}

// Collect reads set.LimitStates and sends the current values.
func (c *limitCollector) Collect(ch chan<- prometheus.Metric) {
	for name, st := range c.set.LimitStates() {
		ch <- prometheus.MustNewConstMetric(descRateLimit, prometheus.GaugeValue, st.Rate, name)
		ch <- prometheus.MustNewConstMetric(descMaxInFlight, prometheus.GaugeValue, float64(st.MaxInFlight), name)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(st.InFlight), name)
		ch <- prometheus.MustNewConstMetric(descThrottledSeconds, prometheus.CounterValue, st.Waited.Seconds(), name, throttledWait)
		ch <- prometheus.MustNewConstMetric(descThrottledSeconds, prometheus.CounterValue, st.Paused.Seconds(), name, throttledRetryAfter)
		for _, r := range throttleReasons {
			ch <- prometheus.MustNewConstMetric(descThrottled, prometheus.CounterValue, float64(st.Throttled[r]), name, string(r))
		}
	}
}

// Package coremetrics is idem's Prometheus plumbing: the consumer's
// collectors (and the breaker and DLQ-depth ones consumer.Run registers),
// which only package consumer uses, and Register, through which every
// package of idem that owns collectors shares a registry. Package metrics documents every metric idem exports in one table,
// and its TestDocTable checks this package's collectors against it.
package coremetrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Outcome label values of idem_messages_total.
const (
	OutcomeProcessed    = "processed"
	OutcomeDuplicate    = "duplicate"
	OutcomeRetried      = "retried"
	OutcomeDeadLettered = "dead_lettered"
	OutcomeParked       = "parked"   // Ordering ByKey: stored behind an earlier message of its key
	OutcomeDeferred     = "deferred" // handler.DeferUntil: stored for the scheduler; the offset is committed
	OutcomeExpired      = "expired"  // past its deadline or maximum age and dropped (consumer.Expiry.Drop); an expired message dead-lettered counts as dead_lettered
	OutcomeSkipped      = "skipped"  // skipped before the inbox: by consumer.Config.Filter, or taken by no route (consumer.UnmatchedSkip)
)

// Action label values of idem_unmatched_total.
const (
	UnmatchedDeadLettered = "dead_lettered" // consumer.UnmatchedDeadLetter
	UnmatchedSkipped      = "skipped"       // consumer.UnmatchedSkip
)

// Action label values of idem_expired_total.
const (
	ExpiredDeadLettered = "dead_lettered" // sent to the DLQ with idem-error-kind "expired"
	ExpiredDropped      = "dropped"       // consumer.Expiry.Drop: not sent anywhere
)

// Result label values of idem_handler_attempts_total.
const (
	ResultOK          = "ok"
	ResultError       = "error"
	ResultPanic       = "panic"
	ResultBreakerOpen = "breaker_open"
	// ResultThrottled: the handler returned a *breaker.ThrottleError (a rate
	// or in-flight limit, or the dependency's Retry-After); the message
	// waits for that dependency (no retry spent) while the member's other
	// partitions go on: the dependency is not failing.
	ResultThrottled = "throttled"
)

// Metrics is the set of idem's collectors. The zero value is not usable; use New.
// All methods are safe for concurrent use.
type Metrics struct {
	Messages          *prometheus.CounterVec   // idem_messages_total
	Attempts          *prometheus.CounterVec   // idem_handler_attempts_total
	HandlerDuration   *prometheus.HistogramVec // idem_handler_duration_seconds
	Retries           *prometheus.CounterVec   // idem_retries_total
	Forwarded         *prometheus.CounterVec   // idem_forwarded_total
	ForwardErrors     *prometheus.CounterVec   // idem_forward_errors_total
	StubsForwarded    *prometheus.CounterVec   // idem_stubs_forwarded_total
	MissingKey        *prometheus.CounterVec   // idem_missing_key_total
	Expired           *prometheus.CounterVec   // idem_expired_total
	Deferred          *prometheus.CounterVec   // idem_deferred_total
	Lanes             *prometheus.GaugeVec     // idem_lanes
	StoreErrors       *prometheus.CounterVec   // idem_store_errors_total
	RetryDelay        *prometheus.HistogramVec // idem_retry_delay_seconds
	DLQDepth          *prometheus.GaugeVec     // idem_dlq_depth
	BreakerState      *prometheus.GaugeVec     // idem_breaker_state
	BreakerTransition *prometheus.CounterVec   // idem_breaker_transitions_total
	BreakerOpen       *prometheus.CounterVec   // idem_breaker_open_seconds_total
	PartitionsPaused  *prometheus.GaugeVec     // idem_partitions_paused
	PartitionsClaimed *prometheus.GaugeVec     // idem_partitions_assigned
	Commits           *prometheus.CounterVec   // idem_commits_total
	Abandoned         *prometheus.CounterVec   // idem_abandoned_total
	PartitionStalled  *prometheus.GaugeVec     // idem_partition_stalled_seconds
	ConsumerLag       *prometheus.GaugeVec     // idem_consumer_lag
	LagActionable     *prometheus.GaugeVec     // idem_consumer_lag_actionable
	LagSeconds        *prometheus.GaugeVec     // idem_consumer_lag_seconds
	EndToEnd          *prometheus.HistogramVec // idem_end_to_end_seconds
	InFlight          *prometheus.GaugeVec     // idem_messages_in_flight
	Filtered          *prometheus.CounterVec   // idem_filtered_total
	Unmatched         *prometheus.CounterVec   // idem_unmatched_total
}

// endToEndBuckets are the buckets of idem_end_to_end_seconds: from 1 ms to
// 1 h, dense enough around typical SLOs (100 ms to 10 s) for p95/p99, and
// reaching the delays of retry tiers.
var endToEndBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600}

// New creates the collectors and registers them on reg. A nil reg registers
// nothing (the metrics still work, unexported). Registering twice on one
// registry reuses the collectors already there, so two consumers in one process
// may share a registry.
func New(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Messages: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_messages_total",
			Help: "Messages with a final outcome (processed, duplicate, retried, dead_lettered, parked, deferred, expired, skipped), by route."}, []string{"group", "topic", "route", "outcome"}),
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_handler_attempts_total",
			Help: "Handler calls by route and result (ok, error, panic, breaker_open, throttled)."}, []string{"group", "topic", "route", "result"}),
		HandlerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_handler_duration_seconds",
			Help:    "Handler call latency, including the dedupe transaction.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"group", "topic", "route"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_retries_total",
			Help: "In-process retries: handler attempts after a failure."}, []string{"group", "topic", "route"}),
		Forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_forwarded_total",
			Help: "Records forwarded to a retry tier or the dead-letter topic, by error kind."}, []string{"group", "destination", "kind"}),
		ForwardErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_forward_errors_total",
			Help: "Failed forwards to a retry tier or the DLQ; the partition retries, nothing is marked."}, []string{"group", "destination"}),
		StubsForwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_stubs_forwarded_total",
			Help: "Records dead-lettered as stubs (value omitted) because the destination refused them whole for good."}, []string{"group", "destination"}),
		MissingKey: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_missing_key_total",
			Help: "Messages without a valid idempotency key."}, []string{"group", "topic", "route"}),
		Expired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_expired_total",
			Help: "Messages past their deadline or their topic's maximum age, not handled; action is dead_lettered or dropped."}, []string{"group", "topic", "route", "action"}),
		Deferred: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_deferred_total",
			Help: "Messages a handler deferred (handler.DeferUntil), stored in PostgreSQL for the group's scheduler."}, []string{"group", "topic"}),
		Lanes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_lanes",
			Help: "Handler attempts this member may run at once under consumer.Config.Limits.Adaptive (the AIMD limit)."}, []string{"group"}),
		StoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_store_errors_total",
			Help: "Dedupe store failures; the message is retried without counting an attempt."}, []string{"group"}),
		RetryDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_retry_delay_seconds",
			Help:    "How long after its idem-due-at a retry record reached the handler.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2, 5, 10, 30, 60}}, []string{"group", "topic"}),
		DLQDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_dlq_depth",
			Help: "Dead-letter records not yet replayed or purged."}, []string{"topic"}),
		BreakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_breaker_state",
			Help: "Circuit breaker state: 0 closed, 1 half-open, 2 open."}, []string{"name"}),
		BreakerTransition: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_breaker_transitions_total",
			Help: "Circuit breaker state changes."}, []string{"name", "from", "to"}),
		BreakerOpen: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_breaker_open_seconds_total",
			Help: "Seconds circuit breakers spent open."}, []string{"name"}),
		PartitionsPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_partitions_paused",
			Help: "Partitions whose fetching is paused, each counted once under the first reason it holds of operator (paused from the console or idem pause), redrive (a re-drive reads its window again), breaker (a dependency's breaker is open) and backpressure (its queue is full)."},
			[]string{"group", "reason"}),
		PartitionsClaimed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_partitions_assigned",
			Help: "Partitions currently claimed by this process."}, []string{"group"}),
		Commits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_commits_total",
			Help: "Offsets marked for commit after a durable outcome."}, []string{"group"}),
		Abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_abandoned_total",
			Help: "In-flight messages cancelled past ShutdownGrace: rolled back and left for redelivery."}, []string{"group"}),
		PartitionStalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_partition_stalled_seconds",
			Help: "Seconds a claimed partition has been failing on the same message (outages, retries, forward errors); 0 while it flows or waits for a dependency's breaker or limit."}, []string{"group", "topic", "partition"}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_consumer_lag",
			Help: "Records behind in a claimed partition: high watermark minus the group's committed offset (source and retry-tier topics)."}, []string{"group", "topic", "partition"}),
		LagActionable: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_consumer_lag_actionable",
			Help: "Records of a claimed partition a member could start now: the source's and the deferred topic's not yet committed, a retry tier's already due, and deferred messages due in PostgreSQL."}, []string{"group", "topic", "partition"}),
		LagSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_consumer_lag_seconds",
			Help: "Seconds the oldest actionable record of a claimed partition has waited (since its timestamp, or since its due time for a retry tier or deferred message); 0 when none."}, []string{"group", "topic", "partition"}),
		EndToEnd: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "idem_end_to_end_seconds",
			Help:    "Seconds from a record's timestamp to its offset being marked (final outcome), histogram.",
			Buckets: endToEndBuckets}, []string{"group", "topic"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "idem_messages_in_flight",
			Help: "Messages taken from a partition's queue whose outcome is not final yet."}, []string{"group", "topic"}),
		Filtered: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_filtered_total",
			Help: "Messages consumer.Config.Filter skipped before the inbox, by the reason it gave."}, []string{"group", "topic", "reason"}),
		Unmatched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_unmatched_total",
			Help: "Messages no route took; action is dead_lettered or skipped (consumer.Config.Unmatched)."}, []string{"group", "topic", "action"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.Messages = Register(reg, m.Messages, &err)
	m.Attempts = Register(reg, m.Attempts, &err)
	m.HandlerDuration = Register(reg, m.HandlerDuration, &err)
	m.Retries = Register(reg, m.Retries, &err)
	m.Forwarded = Register(reg, m.Forwarded, &err)
	m.ForwardErrors = Register(reg, m.ForwardErrors, &err)
	m.StubsForwarded = Register(reg, m.StubsForwarded, &err)
	m.MissingKey = Register(reg, m.MissingKey, &err)
	m.Expired = Register(reg, m.Expired, &err)
	m.Deferred = Register(reg, m.Deferred, &err)
	m.Lanes = Register(reg, m.Lanes, &err)
	m.StoreErrors = Register(reg, m.StoreErrors, &err)
	m.RetryDelay = Register(reg, m.RetryDelay, &err)
	m.DLQDepth = Register(reg, m.DLQDepth, &err)
	m.BreakerState = Register(reg, m.BreakerState, &err)
	m.BreakerTransition = Register(reg, m.BreakerTransition, &err)
	m.BreakerOpen = Register(reg, m.BreakerOpen, &err)
	m.PartitionsPaused = Register(reg, m.PartitionsPaused, &err)
	m.PartitionsClaimed = Register(reg, m.PartitionsClaimed, &err)
	m.Commits = Register(reg, m.Commits, &err)
	m.Abandoned = Register(reg, m.Abandoned, &err)
	m.PartitionStalled = Register(reg, m.PartitionStalled, &err)
	m.ConsumerLag = Register(reg, m.ConsumerLag, &err)
	m.LagActionable = Register(reg, m.LagActionable, &err)
	m.LagSeconds = Register(reg, m.LagSeconds, &err)
	m.EndToEnd = Register(reg, m.EndToEnd, &err)
	m.InFlight = Register(reg, m.InFlight, &err)
	m.Filtered = Register(reg, m.Filtered, &err)
	m.Unmatched = Register(reg, m.Unmatched, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

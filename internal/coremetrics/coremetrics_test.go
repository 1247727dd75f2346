package coremetrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemhq/idem/internal/coremetrics"
)

// Two consumers in one process may share a registry: the second New reuses the
// first one's collectors instead of failing.
func TestNewSharesARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := coremetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := coremetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	a.Messages.WithLabelValues("g", "t", "r", coremetrics.OutcomeProcessed).Inc()
	b.Messages.WithLabelValues("g", "t", "r", coremetrics.OutcomeProcessed).Inc()
	if got := testutil.ToFloat64(a.Messages.WithLabelValues("g", "t", "r", coremetrics.OutcomeProcessed)); got != 2 {
		t.Fatalf("shared counter = %v, want 2", got)
	}
}

// Every collector New makes is registered, and named idem_*.
func TestEveryMetricIsDocumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := coremetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Touch one series of each vector so Gather returns it.
	m.Messages.WithLabelValues("g", "t", "r", "o").Inc()
	m.Attempts.WithLabelValues("g", "t", "r", "r").Inc()
	m.HandlerDuration.WithLabelValues("g", "t", "r").Observe(1)
	m.Retries.WithLabelValues("g", "t", "r").Inc()
	m.Forwarded.WithLabelValues("g", "d", "k").Inc()
	m.ForwardErrors.WithLabelValues("g", "d").Inc()
	m.MissingKey.WithLabelValues("g", "t", "r").Inc()
	m.StoreErrors.WithLabelValues("g").Inc()
	m.RetryDelay.WithLabelValues("g", "t").Observe(1)
	m.DLQDepth.WithLabelValues("t").Set(1)
	m.BreakerState.WithLabelValues("n").Set(1)
	m.BreakerTransition.WithLabelValues("n", "a", "b").Inc()
	m.BreakerOpen.WithLabelValues("n").Add(1)
	m.PartitionsPaused.WithLabelValues("g", "operator").Inc()
	m.PartitionsClaimed.WithLabelValues("g").Inc()
	m.Commits.WithLabelValues("g").Inc()
	m.Abandoned.WithLabelValues("g").Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 17 {
		t.Errorf("gathered %d families, want 17", len(mfs))
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "idem_") {
			t.Errorf("%s lacks the idem_ prefix", mf.GetName())
		}
	}
}

// A nil Registerer keeps the metrics usable without exporting them, and so
// does a nil *prometheus.Registry in it (on which Register would panic).
func TestNilRegisterer(t *testing.T) {
	var registry *prometheus.Registry
	for name, reg := range map[string]prometheus.Registerer{"nil": nil, "nil *prometheus.Registry": registry} {
		t.Run(name, func(t *testing.T) {
			m, err := coremetrics.New(reg)
			if err != nil {
				t.Fatal(err)
			}
			m.Commits.WithLabelValues("g").Inc()
			var rerr error
			c := coremetrics.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: "c"}), &rerr)
			if rerr != nil || c == nil {
				t.Fatalf("Register = %v, %v", c, rerr)
			}
			if !coremetrics.IsNil(reg) {
				t.Fatal("IsNil = false")
			}
		})
	}
	if coremetrics.IsNil(prometheus.NewRegistry()) {
		t.Fatal("IsNil(a registry) = true")
	}
}

package console

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestRegistererSharesTheIndexGauges: Config.Registerer is the one
// registration of the index's gauges. With an indexer given the same
// Registerer (as idem console runs them) the two share one collector: the
// indexer starts instead of failing on a duplicate registration, and adds
// the topic's retention. Once the indexer has stopped, the console still
// exports the unresolved count and age, read from the index.
func TestRegistererSharesTheIndexGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.Registerer = reg })
	dlqTopic, origin := e.k.Topic(t, "dlq", 1), e.k.Topic(t, "origin", 1)
	e.seedDLQ(t, dlqTopic, origin,
		dead{key: "m-1", value: []byte(`{}`), kind: handler.KindPermanent, err: "bad"},
		dead{key: "m-2", value: []byte(`{}`), kind: handler.KindPermanent, err: "bad"})
	stop := e.runIndexer(t, dlqTopic)
	labels := map[string]string{"group": "billing", "topic": dlqTopic}
	idemtest.Eventually(t, 60*time.Second, func() error {
		n, ok := testenv.MetricFound(t, reg, "idem_dlq_unresolved", labels)
		if !ok || n != 2 {
			return fmt.Errorf("idem_dlq_unresolved = %v (found %v), want 2", n, ok)
		}
		if _, ok := testenv.MetricFound(t, reg, "idem_dlq_retention_seconds", map[string]string{"topic": dlqTopic}); !ok {
			return fmt.Errorf("no idem_dlq_retention_seconds{topic=%q}", dlqTopic)
		}
		return nil
	})
	stop()
	if n := testenv.Metric(t, reg, "idem_dlq_unresolved", labels); n != 2 {
		t.Errorf("after the indexer stopped: idem_dlq_unresolved = %v, want 2", n)
	}
	if age := testenv.Metric(t, reg, "idem_dlq_oldest_unresolved_seconds", labels); age < 3000 {
		t.Errorf("idem_dlq_oldest_unresolved_seconds = %v, want about 3600 (seeded an hour ago)", age)
	}
}

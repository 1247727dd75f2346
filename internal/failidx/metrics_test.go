package failidx

import (
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestCollector reads the unresolved records per group and topic from the
// index: a resolved record does not count, and the oldest age is that of
// the oldest unresolved record's last failure.
func TestCollector(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	now := time.Now()
	index(t, pool, 0,
		dead{Topic: "a.billing.dlq", Origin: "a", Key: "k1", Value: []byte("1"), Err: "e", LastFailed: now.Add(-3 * time.Hour)},
		dead{Topic: "a.billing.dlq", Origin: "a", Key: "k2", Value: []byte("2"), Err: "e", LastFailed: now.Add(-2 * time.Hour)},
		dead{Topic: "a.billing.dlq", Origin: "a", Key: "k3", Value: []byte("3"), Err: "e", LastFailed: now.Add(-time.Hour)},
		dead{Topic: "b.ledger.dlq", Group: "ledger", Origin: "b", Key: "k4", Value: []byte("4"), Err: "e", LastFailed: now.Add(-time.Minute)})
	s := NewStore(pool)
	oldest := mustList(t, s, Filter{Key: "k1"})[0]
	if _, err := NewActions(s, nil).Resolve(ctx, "alice", Selection{IDs: []int64{oldest.ID}}, "done"); err != nil {
		t.Fatal(err)
	}
	c := NewCollector(s)
	c.now = func() time.Time { return now }
	c.SetRetention(map[string]time.Duration{"a.billing.dlq": 7 * 24 * time.Hour})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	for _, tt := range []struct {
		name, group, topic string
		want               float64
	}{
		{"idem_dlq_unresolved", "billing", "a.billing.dlq", 2},
		{"idem_dlq_unresolved", "ledger", "b.ledger.dlq", 1},
		{"idem_dlq_oldest_unresolved_seconds", "billing", "a.billing.dlq", 7200},
		{"idem_dlq_oldest_unresolved_seconds", "ledger", "b.ledger.dlq", 60},
		{"idem_dlq_retention_seconds", "", "a.billing.dlq", 604800},
	} {
		if got := failidxtest.Gauge(t, reg, tt.name, tt.group, tt.topic); math.Abs(got-tt.want) > 1 {
			t.Errorf("%s{%s,%s} = %v, want %v", tt.name, tt.group, tt.topic, got, tt.want)
		}
	}
}

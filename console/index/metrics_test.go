package index

import (
	"math"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/testenv"
)

// TestCollector reads the unresolved records per group and topic from the
// index: a resolved record does not count, and the oldest age is that of
// the oldest unresolved record's last failure.
func TestCollector(t *testing.T) {
	pool, _ := newPool(t)
	ctx := testenv.Context(t)
	now := time.Now()
	index(t, pool, 0,
		dead{topic: "a.billing.dlq", origin: "a", key: "k1", value: []byte("1"), err: "e", lastFailed: now.Add(-3 * time.Hour)},
		dead{topic: "a.billing.dlq", origin: "a", key: "k2", value: []byte("2"), err: "e", lastFailed: now.Add(-2 * time.Hour)},
		dead{topic: "a.billing.dlq", origin: "a", key: "k3", value: []byte("3"), err: "e", lastFailed: now.Add(-time.Hour)},
		dead{topic: "b.ledger.dlq", group: "ledger", origin: "b", key: "k4", value: []byte("4"), err: "e", lastFailed: now.Add(-time.Minute)})
	s := NewStore(pool)
	oldest := mustList(t, s, Filter{Key: "k1"})[0]
	if _, err := NewActions(s, nil).Resolve(ctx, "alice", Selection{IDs: []int64{oldest.ID}}, "done"); err != nil {
		t.Fatal(err)
	}
	c := newCollector(s)
	c.now = func() time.Time { return now }
	c.setRetention(map[string]time.Duration{"a.billing.dlq": 7 * 24 * time.Hour})
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
		if got := gauge(t, reg, tt.name, tt.group, tt.topic); math.Abs(got-tt.want) > 1 {
			t.Errorf("%s{%s,%s} = %v, want %v", tt.name, tt.group, tt.topic, got, tt.want)
		}
	}
}

// TestIndexerReadsRetention: the indexer exports each DLQ topic's
// retention.ms.
func TestIndexerReadsRetention(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := newPool(t)
	topic := testenv.Unique("ret") + ".billing.dlq"
	ms := "3600000"
	if err := k.Admin(t).CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: map[string]*string{"retention.ms": &ms}}, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.DeleteTopics(t, topic) })
	k.WaitTopic(t, topic, 1)
	reg := prometheus.NewRegistry()
	runUntil(t, &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: testenv.Group(t), Topics: []string{topic}, Registerer: reg})
	testenv.Eventually(t, 30*time.Second, func() error {
		mfs, err := reg.Gather()
		if err != nil {
			return err
		}
		for _, mf := range mfs {
			if mf.GetName() == "idem_dlq_retention_seconds" && len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetGauge().GetValue() == 3600 {
				return nil
			}
		}
		return errNotYet
	})
}

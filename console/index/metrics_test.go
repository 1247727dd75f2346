package index

import (
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/failidx/failidxtest"
	"github.com/idemhq/idem/internal/testenv"
)

// TestIndexerReadsRetention: the indexer exports each DLQ topic's
// retention.ms.
func TestIndexerReadsRetention(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
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

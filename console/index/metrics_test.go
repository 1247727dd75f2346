package index

import (
	"log/slog"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestIndexerReadsRetention: the indexer exports each DLQ topic's
// retention.ms, also with the client config of idem's CLI (no full
// metadata) and topics named (idem console --topics), without a WARN on the
// way.
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
	cfg := k.SaramaConfig()
	cfg.Metadata.Full = false // as idem's CLI sets it
	logs := &logCounter{want: "retention"}
	runUntil(t, &Indexer{Brokers: k.Brokers, Sarama: cfg, Pool: pool, Group: testenv.Group(t), Topics: []string{topic}, Registerer: reg,
		Logger: slog.New(logs)})
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
	if n := logs.count(); n != 0 {
		t.Errorf("%d log records about retention on the way", n)
	}
}

package index

import (
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/committedtest"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestIndexerReadsCommittedOnly: a dead-letter topic written with
// transactions holds commit markers and the records of aborted
// transactions. The indexer reads it as a read_committed consumer: the
// aborted record is never indexed as a dead letter.
func TestIndexerReadsCommittedOnly(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
	topic, origin := k.Topic(t, 1), k.Topic(t, 1)
	msg := func(key string) *sarama.ProducerMessage {
		d := dead{Topic: topic, Origin: origin, Key: key, Value: []byte(`{"id":"` + key + `"}`), Err: "card declined"}
		return &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(d.Value), Headers: d.Headers()}
	}
	committedtest.Produce(t, k.Brokers, k.SaramaConfig(), false, msg("pay-1"))
	committedtest.Produce(t, k.Brokers, k.SaramaConfig(), true, msg("rolled-back"))
	committedtest.Produce(t, k.Brokers, k.SaramaConfig(), false, msg("pay-2"), msg("pay-3"))

	ix := &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Topics: []string{topic}, Group: testenv.Group(t),
		RefreshInterval: 200 * time.Millisecond}
	runUntil(t, ix)
	failidxtest.WaitCount(t, pool, 1, `SELECT count(*) FROM idem_dlq_records WHERE idempotency_key = 'pay-3'`)
	if n := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records`); n != 3 {
		t.Errorf("%d records indexed, want the 3 committed dead letters", n)
	}
	if n := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records WHERE idempotency_key = 'rolled-back'`); n != 0 {
		t.Errorf("the aborted record was indexed (%d rows)", n)
	}
}

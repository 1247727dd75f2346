package consumer_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestStartAtNewestSkipsTheBacklog: a new group with StartAt: StartNewest
// handles only records produced after it joined.
func TestStartAtNewestSkipsTheBacklog(t *testing.T) {
	e := newEnv(t, 1)
	e.produce([]string{"old-1", "old-2"}, 1)
	cfg := e.config()
	cfg.StartAt = consumer.StartNewest
	start(t, cfg, effectHandler())
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := metricValue(t, e, "idem_partitions_assigned", nil); n != 1 {
			return fmt.Errorf("%v partitions claimed", n)
		}
		return nil
	})
	// The claim starts at the end offset it resolved on joining; produce
	// until a new record is handled (the first may race the claim's start).
	p := e.k.Producer(t)
	testenv.Eventually(t, 60*time.Second, func() error {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder("{}"),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(testenv.Unique("new"))}}}); err != nil {
			return err
		}
		if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'new%'`); n == 0 {
			return errors.New("no new record handled yet")
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'old-%'`); n != 0 {
		t.Errorf("%d records of the backlog handled with StartAt newest", n)
	}
}

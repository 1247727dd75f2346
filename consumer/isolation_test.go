package consumer_test

import (
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestAbortedTransactionsAreNeverHandled: records a transactional producer
// wrote and then aborted are not handled (read_committed is the default).
func TestAbortedTransactionsAreNeverHandled(t *testing.T) {
	e := newEnv(t, 1)
	pcfg := e.k.SaramaConfig()
	pcfg.Producer.Idempotent = true
	pcfg.Producer.RequiredAcks = sarama.WaitForAll
	pcfg.Producer.Return.Successes = true
	pcfg.Producer.Transaction.ID = testenv.Unique("tx")
	pcfg.Producer.Partitioner = sarama.NewManualPartitioner
	pcfg.Net.MaxOpenRequests = 1
	p, err := sarama.NewSyncProducer(e.k.Brokers, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	send := func(key string) {
		t.Helper()
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder(`{"op":"ok"}`),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		keys   []string
		commit bool
	}{{[]string{"aborted-1", "aborted-2"}, false}, {[]string{"committed"}, true}} {
		if err := p.BeginTxn(); err != nil {
			t.Fatal(err)
		}
		for _, k := range step.keys {
			send(k)
		}
		if step.commit {
			err = p.CommitTxn()
		} else {
			err = p.AbortTxn()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	start(t, e.config(), hardHandler(func() bool { return false }))
	// The committed record follows the aborted ones in the partition: once it
	// is applied, they were skipped. (The end offset counts the transaction
	// markers, which a consumer never receives, so it is not waited for.)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects WHERE key = 'committed'`); n != 1 {
			return fmt.Errorf("committed record applied %d times, want 1", n)
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'aborted-%'`); n != 0 {
		t.Errorf("aborted records applied %d times, want 0", n)
	}
}

// sortByOrigin orders forwarded records by their idem-original-offset.
func sortByOrigin(recs []*sarama.ConsumerMessage) {
	off := func(m *sarama.ConsumerMessage) int64 {
		v, _ := coreHeader(m, "idem-original-offset")
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	sort.SliceStable(recs, func(i, j int) bool { return off(recs[i]) < off(recs[j]) })
}

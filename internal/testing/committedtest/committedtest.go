// Package committedtest is a writer of records in Kafka transactions for the tests
// of the readers of dead-letter topics (package dlq, idemtest.ReadDLQ, the
// failure index, the CLI), as a consumer with Config.Transactions writes
// its forwards: each transaction ends with a marker that takes an offset.
package committedtest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/IBM/sarama"
)

// Produce writes msgs in one transaction with a transactional producer of
// its own (its transactional.id unique to the call), committing it, or
// aborting it when abort is true, and closes the producer. msgs name their
// partition (the producer partitions manually). base gives the brokers'
// version, TLS and SASL; it is copied. The test fails on any error.
func Produce(tb testing.TB, brokers []string, base *sarama.Config, abort bool, msgs ...*sarama.ProducerMessage) {
	tb.Helper()
	cfg := *base
	var id [8]byte
	_, _ = rand.Read(id[:])
	cfg.Producer.Idempotent = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Retry.Max = 10
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Transaction.ID = "committedtest-" + hex.EncodeToString(id[:])
	cfg.Net.MaxOpenRequests = 1
	if !cfg.Version.IsAtLeast(sarama.V2_5_0_0) {
		cfg.Version = sarama.V2_5_0_0
	}
	p, err := sarama.NewSyncProducer(brokers, &cfg)
	if err != nil {
		tb.Fatalf("committedtest: transactional producer: %v", err)
	}
	defer p.Close()
	if err := p.BeginTxn(); err != nil {
		tb.Fatalf("committedtest: begin: %v", err)
	}
	if err := p.SendMessages(msgs); err != nil {
		_ = p.AbortTxn()
		tb.Fatalf("committedtest: send: %v", err)
	}
	if abort {
		err = p.AbortTxn()
	} else {
		err = p.CommitTxn()
	}
	if err != nil {
		tb.Fatalf("committedtest: end the transaction (abort %v): %v", abort, err)
	}
}

package consumer_test

// Crossing tests of issue 28 without Transactions, or in every mode.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/recovery"
)

// Defect 11: a drain promotes P, failing with an error a rule with its own
// DLQ matches (its tiers are the fallback's), and the member stops before
// P's forward. The next claim recovers the pending head: P goes to tier 1,
// or, when tier 1 refuses it for good, to its rule's DLQ, not the
// fallback's.
func TestCrossingRecoveredHeadKeepsItsRule(t *testing.T) {
	t.Parallel()
	for _, refuse := range []bool{false, true} { // tier 1 refuses P for good
		t.Run(fmt.Sprintf("tier-refuses=%v", refuse), func(t *testing.T) {
			t.Parallel()
			forEachMode(t, []testMode{"", "lanes"}, func(t *testing.T, mode testMode) {
				crossingRecoveredHeadKeepsItsRule(t, mode, refuse)
			})
		})
	}
}

func crossingRecoveredHeadKeepsItsRule(t *testing.T, mode testMode, refuse bool) {
	t.Logf("tier 1 refuses P: %v", refuse)
	e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
	e.in(mode)
	cfg = mode.apply(cfg)
	cfg.ShutdownGrace = 300 * time.Millisecond
	errFraud := errors.New("bank: fraud suspected")
	fraudDLQ := e.topic + ".dlq.fraud"
	cfg.Retry.Rules = []recovery.Rule{{Name: "fraud", Match: recovery.Is(errFraud), DLQ: fraudDLQ}}
	t.Cleanup(func() { e.k.DeleteTopics(t, fraudDLQ) })
	value := []byte("P")
	if refuse {
		limit := "1000"
		if err := e.k.Admin(t).CreateTopic(e.tier(1), &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
			ConfigEntries: map[string]*string{"max.message.bytes": &limit}}, false); err != nil {
			t.Fatal(err)
		}
		e.k.WaitTopic(t, e.tier(1), 1)
		value = make([]byte, 5000)
	}
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Topic == e.topic && (m.IdempotencyKey == "H" || m.IdempotencyKey == "P") {
			return fmt.Errorf("charge: %w", errFraud) // at the source: to the rule's tier
		}
		return apply(ctx, m)
	})
	var run runHandle
	var stopped atomic.Bool
	ctx := consumer.WithOrderHooks(testenv.Context(t), func(stop, hctx context.Context, rec keyorder.Record) {
		if rec.IdempotencyKey == "P" && stopped.CompareAndSwap(false, true) {
			run.cancel() // stopped between P's promotion and its forward
			<-hctx.Done()
		}
	}, nil)
	p := e.bigProducer()
	for _, r := range []struct {
		ikey  string
		value []byte
	}{{"H", []byte("H")}, {"P", value}, {"S", []byte("S")}} {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder("K"), Value: sarama.ByteEncoder(r.value),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(r.ikey)}}}); err != nil {
			t.Fatal(err)
		}
	}
	run.set(startCtx(t, ctx, cfg, h))
	testenv.Eventually(t, 60*time.Second, func() error {
		if !stopped.Load() {
			return errors.New("P not promoted yet")
		}
		return nil
	})
	if err := run.r.stop(); err != nil {
		t.Fatal(err)
	}
	if n := e.count(`SELECT count(*) FROM idem_ordering_heads WHERE pending IS NOT NULL`); n != 1 {
		t.Fatalf("%d pending heads after the stop, want P's", n)
	}
	start(t, cfg, h)
	want := "H,P,S"
	if refuse {
		want = "H,S"
	}
	e.waitSettled(want)
	dlq := e.ikeyCopies(fraudDLQ)
	if refuse && dlq["P"] != 1 {
		t.Errorf("the rule's DLQ holds %v, want P (its tier refused it)", dlq)
	}
	if !refuse && len(dlq) != 0 {
		t.Errorf("the rule's DLQ holds %v, want nothing", dlq)
	}
	if n := e.total(e.dlq(), 1); n != 0 {
		t.Errorf("the fallback DLQ holds %d records, want none", n)
	}
}

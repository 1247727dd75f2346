package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// produceKeyed sends, to partition 0, n messages for each of keys (Kafka key
// = the key, value = its sequence number, idempotency key unique), with the
// keys interleaved.
func (e *env) produceKeyed(keys []string, n int) {
	e.t.Helper()
	p := e.k.Producer(e.t)
	var msgs []*sarama.ProducerMessage
	for i := range n {
		for _, k := range keys {
			msgs = append(msgs, &sarama.ProducerMessage{
				Topic: e.topic, Partition: 0, Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(fmt.Sprint(i)),
				Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(fmt.Sprintf("%s-%d", k, i))}},
			})
		}
	}
	if err := p.SendMessages(msgs); err != nil {
		e.t.Fatal(err)
	}
}

// TestLanesKeepPerKeyOrder: with 16 lanes by Kafka key, messages of one key
// are handled in their order while keys run in parallel.
func TestLanesKeepPerKeyOrder(t *testing.T) {
	e := newEnv(t, 1)
	keys := make([]string, 24)
	for i := range keys {
		keys[i] = fmt.Sprintf("key%02d", i)
	}
	const per = 40
	e.produceKeyed(keys, per)
	var mu sync.Mutex
	seen := map[string][]string{}
	var inFlight, peak atomic.Int32
	cfg := e.config()
	cfg.Concurrency = 16
	cfg.LaneBy = consumer.LaneByKafkaKey
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(time.Millisecond) // an I/O-bound handler, so lanes overlap
		mu.Lock()
		seen[string(m.Key)] = append(seen[string(m.Key)], string(m.Value))
		mu.Unlock()
		return effectHandler()(ctx, m)
	}))
	e.waitCommitted(e.topic, 1, 60*time.Second)
	mu.Lock()
	defer mu.Unlock()
	for _, k := range keys {
		got := seen[k]
		if len(got) != per {
			t.Errorf("key %s: handled %d messages, want %d", k, len(got), per)
			continue
		}
		for i, v := range got {
			if v != fmt.Sprint(i) {
				t.Errorf("key %s: message %d handled as number %d: order lost (%v)", k, i, i, got)
				break
			}
		}
	}
	if peak.Load() < 2 {
		t.Errorf("at most %d handler ran at once: lanes did not run in parallel", peak.Load())
	}
	e.coreAssertOnePerKey(len(keys) * per)
}

// TestLanesNeverCommitPastUnfinished: the first message blocks while later
// ones, on other lanes, finish; shutting down then commits nothing past the
// unfinished one, and a restart handles it with no double effect.
func TestLanesNeverCommitPastUnfinished(t *testing.T) {
	e := newEnv(t, 1)
	// Keys on lanes other than a's (lane = fnv32a(Kafka key) mod 4), so that
	// only a's messages wait behind the blocked a-0.
	lane := func(k string) uint32 { h := fnv.New32a(); h.Write([]byte(k)); return h.Sum32() % 4 }
	keys := []string{"a"}
	for i := 0; len(keys) < 6; i++ {
		if k := fmt.Sprintf("k%d", i); lane(k) != lane("a") {
			keys = append(keys, k)
		}
	}
	e.produceKeyed(keys, 5) // offset 0 is a-0
	cfg := e.config()
	cfg.Concurrency = 4
	cfg.LaneBy = consumer.LaneByKafkaKey
	cfg.ShutdownGrace = 500 * time.Millisecond
	eff := effectHandler()
	r := start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Offset == 0 {
			<-ctx.Done() // unfinished until the grace period ends
			return ctx.Err()
		}
		return eff(ctx, m)
	}))
	// Every message of other keys finishes (a's later messages wait behind a-0 in its lane).
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects WHERE key NOT LIKE 'a-%'`); n != 25 {
			return fmt.Errorf("%d of 25 effects", n)
		}
		return nil
	})
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if c := e.committed(e.topic, 1)[0]; c > 0 {
		t.Fatalf("committed offset %d while offset 0 never finished", c)
	}
	start(t, e.config(), eff)
	e.waitCommitted(e.topic, 1, 60*time.Second)
	e.coreAssertOnePerKey(30)
}

// TestBatchHandlerPartialFailure: a batch handler names one message as
// permanently failed and one as failing once; the rest commit in batches,
// the permanent one is dead-lettered, the other succeeds on its retry, and
// every key has one effect.
func TestBatchHandlerPartialFailure(t *testing.T) {
	e := newEnv(t, 1)
	keys := coreKeys("bh", 200)
	e.produce(keys, 1)
	var failedOnce atomic.Bool
	var batches, biggest atomic.Int32
	cfg := e.config()
	cfg.Batch = consumer.BatchConfig{MaxMessages: 64}
	h := handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
		batches.Add(1)
		if n := int32(len(msgs)); n > biggest.Load() {
			biggest.Store(n)
		}
		var be handler.BatchError
		ks := make([]string, 0, len(msgs))
		topics := make([]string, 0, len(msgs))
		parts := make([]int32, 0, len(msgs))
		offs := make([]int64, 0, len(msgs))
		for _, m := range msgs {
			switch {
			case m.IdempotencyKey == keys[10]:
				be.Add(m, handler.Permanent(errors.New("rejected by the bank")))
				continue
			case m.IdempotencyKey == keys[20] && !failedOnce.Swap(true):
				be.Add(m, errors.New("timeout talking to the bank"))
				continue
			}
			ks, topics, parts, offs = append(ks, m.IdempotencyKey), append(topics, m.Topic), append(parts, m.Partition), append(offs, m.Offset)
		}
		if _, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO effects(key, topic, part, off) SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::bigint[])`,
			ks, topics, parts, offs); err != nil {
			return err
		}
		if len(be.Failed) > 0 {
			return &be
		}
		return nil
	})
	start(t, cfg, h)
	recs := e.coreReadRecords(e.topic+"."+e.group+".dlq", 0, 1, 60*time.Second)
	if k, _ := coreHeader(recs[0], "idempotency-key"); k != keys[10] {
		t.Errorf("dead-lettered %q, want %q", k, keys[10])
	}
	if kind, _ := coreHeader(recs[0], "idem-error-kind"); kind != "permanent" {
		t.Errorf("kind %q, want permanent", kind)
	}
	e.waitCommitted(e.topic, 1, 60*time.Second)
	if n := e.count(`SELECT count(*) FROM effects`); n != 199 {
		t.Errorf("effects: %d, want 199", n)
	}
	if n := e.count(`SELECT count(DISTINCT key) FROM effects`); n != 199 {
		t.Errorf("distinct keys with effects: %d, want 199", n)
	}
	if biggest.Load() < 2 {
		t.Errorf("largest batch %d: messages were not batched", biggest.Load())
	}
	t.Logf("%d HandleBatch calls, largest batch %d", batches.Load(), biggest.Load())
}

// TestBatchHandlerThroughRetryTiers: with handler.Batch, a message that keeps
// failing retriably leaves its batch, spends its in-process retries as a
// batch of one, goes to retry tier 1 and succeeds there; the rest of its
// batch commits without it.
func TestBatchHandlerThroughRetryTiers(t *testing.T) {
	e := newEnv(t, 1)
	keys := coreKeys("tier", 50)
	e.produce(keys, 1)
	var fromTier atomic.Int32
	cfg := e.config()
	cfg.Batch = consumer.BatchConfig{MaxMessages: 16}
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{100 * time.Millisecond}}
	h := handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
		var be handler.BatchError
		for _, m := range msgs {
			if m.IdempotencyKey == keys[7] {
				if m.Topic == e.topic { // fails until it comes back from the tier
					be.Add(m, errors.New("bank timeout"))
					continue
				}
				fromTier.Add(1)
			}
			if _, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO effects(key, topic, part, off) VALUES ($1,$2,$3,$4)`,
				m.IdempotencyKey, m.Topic, m.Partition, m.Offset); err != nil {
				return err
			}
		}
		if len(be.Failed) > 0 {
			return &be
		}
		return nil
	})
	start(t, cfg, h)
	e.waitCommitted(e.topic, 1, 60*time.Second)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects`); n != 50 {
			return fmt.Errorf("%d of 50 effects", n)
		}
		return nil
	})
	e.coreAssertOnePerKey(50)
	if fromTier.Load() != 1 {
		t.Errorf("%s handled from the tier %d times, want 1", keys[7], fromTier.Load())
	}
	if n := metricValue(t, e, "idem_retries_total", nil); n != 3 {
		t.Errorf("idem_retries_total = %v, want 3 (the default in-process retries, each a batch of one)", n)
	}
	if n := metricValue(t, e, "idem_messages_total", map[string]string{"outcome": "retried"}); n != 1 {
		t.Errorf("sent to a tier %v times, want 1", n)
	}
}

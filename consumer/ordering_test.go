package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// Issue 4, test 6: ordering mode. Keys A and B interleaved on one partition;
// A's first message fails twice → B flows on; A's later messages are applied
// after A's first, in order; a restart in the middle changes nothing.
func TestOrderingByKey(t *testing.T) {
	t.Parallel()
	forEachMode(t, orderingModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		ctx := testenv.Context(t)
		if _, err := e.pool.Exec(ctx, `CREATE TABLE applied(seq bigserial primary key, kafka_key text, ikey text)`); err != nil {
			t.Fatal(err)
		}
		cfg := e.config()
		cfg.Retry.Attempts = 1
		cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{300 * time.Millisecond, 300 * time.Millisecond}}
		cfg.Ordering = consumer.ByKey(e.pool)

		var mu sync.Mutex
		failures := map[string]int{}
		release := make(chan struct{}) // A1's second failure waits here, so the test can restart mid-way
		var releaseOnce sync.Once
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "A1" {
				mu.Lock()
				failures["A1"]++
				n := failures["A1"]
				mu.Unlock()
				if n == 2 {
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				if n <= 2 {
					return errors.New("A1 not yet")
				}
			}
			_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO applied(kafka_key, ikey) VALUES ($1,$2)`, string(m.Key), m.IdempotencyKey)
			return err
		})
		p := e.k.Producer(t)
		order := []string{"A1", "B1", "A2", "B2", "A3", "B3"}
		for _, ik := range order {
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder(ik[:1]),
				Value: sarama.StringEncoder(ik), Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(ik)}}}); err != nil {
				t.Fatal(err)
			}
		}
		first := start(t, cfg, h)
		// B flows on while A1 waits in a retry tier; A2 and A3 are parked.
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM applied WHERE kafka_key='B'`); n != 3 {
				return fmt.Errorf("%d B applied", n)
			}
			if n := e.count(`SELECT count(*) FROM idem_ordering_parked`); n != 2 {
				return fmt.Errorf("%d parked", n)
			}
			return nil
		})
		if n := e.count(`SELECT count(*) FROM applied WHERE kafka_key='A'`); n != 0 {
			t.Fatalf("%d A messages overtook A1", n)
		}
		// Restart in the middle: A1 is in its second attempt (tier 1), A2 and A3 parked.
		testenv.Eventually(t, 60*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if failures["A1"] < 2 {
				return errors.New("A1 not in its second attempt yet")
			}
			return nil
		})
		if err := first.stop(); err != nil {
			t.Fatal(err)
		}
		releaseOnce.Do(func() { close(release) })
		start(t, cfg, h)
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM applied`); n != 6 {
				return fmt.Errorf("%d applied", n)
			}
			return nil
		})
		rows, err := e.pool.Query(ctx, `SELECT ikey FROM applied WHERE kafka_key='A' ORDER BY seq`)
		if err != nil {
			t.Fatal(err)
		}
		var as []string
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			as = append(as, s)
		}
		if got := strings.Join(as, ","); got != "A1,A2,A3" {
			t.Fatalf("A applied in order %s, want A1,A2,A3", got)
		}
		// The drain deletes its rows after the last message's commit: wait.
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM idem_ordering_parked`) + e.count(`SELECT count(*) FROM idem_ordering_heads`); n != 0 {
				return fmt.Errorf("%d ordering rows left", n)
			}
			return nil
		})
		if n := e.count(`SELECT count(*) FROM applied`); n != 6 {
			t.Fatalf("%d applied, want 6", n)
		}
		e.waitCommitted(e.topic, 1, 30*time.Second)
	})
}

// A parked message that fails while its key drains becomes the key's new head;
// the messages parked behind it still follow in order.
func TestOrderingParkedFailureBecomesHead(t *testing.T) {
	t.Parallel()
	forEachMode(t, orderingModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		ctx := testenv.Context(t)
		if _, err := e.pool.Exec(ctx, `CREATE TABLE applied(seq bigserial primary key, ikey text)`); err != nil {
			t.Fatal(err)
		}
		cfg := e.config()
		cfg.Retry.Attempts = 1
		cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{200 * time.Millisecond}}
		cfg.Ordering = consumer.ByKey(e.pool)
		var mu sync.Mutex
		failed := map[string]bool{}
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			mu.Lock()
			first := !failed[m.IdempotencyKey]
			failed[m.IdempotencyKey] = true
			mu.Unlock()
			if first && (m.IdempotencyKey == "A1" || m.IdempotencyKey == "A2") {
				return errors.New("first try fails")
			}
			_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO applied(ikey) VALUES ($1)`, m.IdempotencyKey)
			return err
		})
		p := e.k.Producer(t)
		for _, ik := range []string{"A1", "A2", "A3", "A4"} {
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder("A"),
				Value: sarama.StringEncoder(ik), Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(ik)}}}); err != nil {
				t.Fatal(err)
			}
		}
		r := start(t, cfg, h)
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM applied`); n != 4 {
				return fmt.Errorf("%d applied", n)
			}
			return nil
		})
		var got string
		if err := e.pool.QueryRow(ctx, `SELECT string_agg(ikey, ',' ORDER BY seq) FROM applied`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != "A1,A2,A3,A4" {
			t.Fatalf("applied %s, want A1,A2,A3,A4", got)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM idem_ordering_parked`) + e.count(`SELECT count(*) FROM idem_ordering_heads`); n != 0 {
				return fmt.Errorf("%d ordering rows left", n)
			}
			return nil
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		// Counted by a read_committed reader: with Transactions the end
		// offset counts the commit markers too.
		if n := len(e.records(e.tier(1), sarama.ReadCommitted)); n != 2 {
			t.Errorf("tier 1 got %d records, want 2 (A1, then A2 as the new head)", n)
		}
	})
}

// A crash between promoting a parked message to head and forwarding it leaves
// the forward pending in PostgreSQL; the next Run forwards it first, so the key
// is not stranded, and its parked successors follow.
func TestOrderingRecoversPendingForward(t *testing.T) {
	t.Parallel()
	forEachMode(t, orderingModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		ctx := testenv.Context(t)
		if err := schema.Migrate(ctx, e.pool, nil, nil); err != nil {
			t.Fatal(err)
		}
		cfg := e.config()
		cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{100 * time.Millisecond}}
		cfg.Ordering = consumer.ByKey(e.pool)
		// The state a crash left: A2 is K's head with its tier-1 forward pending,
		// and A3 is parked behind it. Neither is in Kafka any more.
		now := time.Now()
		hdrs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("A2")}}, retrytopic.Failure{
			Attempt: 1, Tier: 1, DueAt: now, OriginalTopic: e.topic, OriginalPartition: 0, OriginalOffset: 1,
			OriginalTimestamp: now, Group: e.group, Error: "boom", Kind: handler.KindRetriable, FirstFailureAt: now, LastFailureAt: now,
		})
		type h struct {
			K string `json:"k"`
			V []byte `json:"v"`
		}
		var pendingHeaders []h
		for _, x := range hdrs {
			pendingHeaders = append(pendingHeaders, h{string(x.Key), x.Value})
		}
		pending, err := json.Marshal(map[string]any{"topic": e.topic, "key": []byte("A"), "ikey": "A2", "partition": 0, "offset": 1,
			"ts": now, "value": []byte("A2"), "headers": pendingHeaders, "tier": 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `INSERT INTO idem_ordering_heads(consumer_group, topic, msg_key, head_key, pending) VALUES ($1,$2,$3,'A2',$4)`,
			e.group, e.topic, []byte("A"), pending); err != nil {
			t.Fatal(err)
		}
		if _, err := e.pool.Exec(ctx, `INSERT INTO idem_ordering_parked(consumer_group, topic, msg_key, idempotency_key, "partition", "offset", record_time, value, header_keys, header_values)
			VALUES ($1,$2,$3,'A3',0,2,now(),'A3',ARRAY['idempotency-key'::bytea],ARRAY['A3'::bytea])`, e.group, e.topic, []byte("A")); err != nil {
			t.Fatal(err)
		}
		start(t, cfg, effectHandler())
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM effects`); n != 2 {
				return fmt.Errorf("%d effects", n)
			}
			return nil
		})
		var got string
		if err := e.pool.QueryRow(ctx, `SELECT string_agg(key, ',' ORDER BY at, key) FROM effects`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != "A2,A3" {
			t.Fatalf("effects %s, want A2,A3", got)
		}
		testenv.Eventually(t, 30*time.Second, func() error {
			if n := e.count(`SELECT count(*) FROM idem_ordering_heads`) + e.count(`SELECT count(*) FROM idem_ordering_parked`); n != 0 {
				return fmt.Errorf("%d ordering rows left", n)
			}
			return nil
		})
	})
}

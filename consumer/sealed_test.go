package consumer_test

import (
	"context"
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
	"github.com/idemhq/idem/internal/testing/sealtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/schedule"
)

// Payload encryption at rest of what the consumer keeps in PostgreSQL
// (issue 29, item 16; Config.EncryptionKey): parked ordering rows and
// deferred messages are sealed (checked with SQL: no plaintext, the clear
// columns empty), come back intact through the real path (park → release,
// defer → publish), and, once their data key is destroyed, end as
// dead-letter stubs with the reason, never handled.

// secretValue and secretHeader are what no table may hold in clear.
func secretValue(ikey string) string  { return "card 4111111111111111 of " + ikey }
func secretHeader(ikey string) string { return "hdr-secret-" + ikey }

// produceSecrets sends one record per idempotency key to partition 0, with
// Kafka key kafkaKey, a secret value and a secret header.
func (e *env) produceSecrets(kafkaKey string, ikeys ...string) {
	e.t.Helper()
	p := e.k.Producer(e.t)
	for _, ik := range ikeys {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder(kafkaKey),
			Value: sarama.StringEncoder(secretValue(ik)), Headers: []sarama.RecordHeader{
				{Key: []byte("idempotency-key"), Value: []byte(ik)}, {Key: []byte("x-secret"), Value: []byte(secretHeader(ik))}}}); err != nil {
			e.t.Fatal(err)
		}
	}
}

// checkStubs checks that the DLQ holds a stub of each of ikeys (no value,
// none of their headers, kind permanent, a reason naming the destroyed
// key) and nothing else.
func (e *env) checkStubs(ikeys ...string) {
	e.t.Helper()
	var got []*sarama.ConsumerMessage
	testenv.Eventually(e.t, 60*time.Second, func() error {
		if got = e.readAll(e.dlq(), 1); len(got) < len(ikeys) {
			return fmt.Errorf("%d of %d stubs in the DLQ", len(got), len(ikeys))
		}
		return nil
	})
	seen := map[string]bool{}
	for _, m := range got {
		ik := header(m, "idem-idempotency-key")
		seen[ik] = true
		if m.Value != nil || header(m, "idem-payload-omitted") == "" || header(m, "x-secret") != "" ||
			header(m, "idem-error-kind") != string(handler.KindPermanent) || !strings.Contains(header(m, "idem-error"), "key destroyed") ||
			header(m, "idem-original-topic") != e.topic {
			e.t.Errorf("DLQ record of %q: value %q, headers %v: want a permanent stub naming the destroyed key", ik, m.Value, m.Headers)
		}
	}
	for _, ik := range ikeys {
		if !seen[ik] {
			e.t.Errorf("no stub of %s in the DLQ (got %d records)", ik, len(got))
		}
	}
	if len(got) != len(ikeys) {
		e.t.Errorf("the DLQ holds %d records, want %d stubs", len(got), len(ikeys))
	}
}

// countIs reports, as an error to poll on, whether q counts want rows
// (the consumer creates its tables as it starts).
func (e *env) countIs(q string, want int) error {
	var n int
	if err := e.query.QueryRow(context.Background(), q).Scan(&n); err != nil {
		return err
	}
	if n != want {
		return fmt.Errorf("%s: %d, want %d", q, n, want)
	}
	return nil
}

// TestSealedParkedMessages: with ByKey ordering and a key, the messages
// parked behind A1 are sealed at rest; when A1 succeeds they are drained
// and handled with their value and headers intact; with their data key
// destroyed meanwhile, each ends in the DLQ as a stub, unhandled.
func TestSealedParkedMessages(t *testing.T) {
	t.Parallel()
	for _, destroyed := range []bool{false, true} {
		name := map[bool]string{false: "park then drain", true: "key destroyed"}[destroyed]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			ctx := testenv.Context(t)
			if _, err := e.pool.Exec(ctx, `CREATE TABLE applied(seq bigserial primary key, ikey text, value text, secret text)`); err != nil {
				t.Fatal(err)
			}
			cfg := e.config()
			cfg.Retry.Attempts = 1
			cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{200 * time.Millisecond}}
			cfg.Ordering = consumer.ByKey(e.pool)
			cfg.EncryptionKey = sealtest.KEK(t)
			release := make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) })
			h := handler.Func(func(ctx context.Context, m *handler.Message) error {
				if m.IdempotencyKey == "A1" {
					if m.Attempt == 1 {
						return errors.New("A1 not yet") // to its tier: A2 and A3 park behind it
					}
					select { // in its tier: wait for the test
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				secret, _ := m.Header("x-secret")
				_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO applied(ikey, value, secret) VALUES ($1, $2, $3)`,
					m.IdempotencyKey, string(m.Value), string(secret))
				return err
			})
			e.produceSecrets("A", "A1", "A2", "A3")
			start(t, cfg, h)
			testenv.Eventually(t, 60*time.Second, func() error { return e.countIs(`SELECT count(*) FROM idem_ordering_parked`, 2) })
			if n := e.count(`SELECT count(*) FROM idem_ordering_parked WHERE key_id IS NOT NULL AND sealed IS NOT NULL
				AND value IS NULL AND cardinality(header_keys) = 0 AND cardinality(header_values) = 0
				AND position('4111111111111111'::bytea IN sealed) = 0 AND position('hdr-secret'::bytea IN sealed) = 0`); n != 2 {
				t.Fatalf("%d of 2 parked rows sealed at rest", n)
			}
			if destroyed {
				sealtest.DestroyKeys(t, e.query, "ordering", `SELECT max(parked_at) FROM idem_ordering_parked`)
			}
			once.Do(func() { close(release) })

			if destroyed {
				e.checkStubs("A2", "A3")
				testenv.Eventually(t, 60*time.Second, func() error {
					if n := e.count(`SELECT count(*) FROM idem_ordering_parked`); n != 0 {
						return fmt.Errorf("%d parked rows left", n)
					}
					return nil
				})
				if n := e.count(`SELECT count(*) FROM applied WHERE ikey <> 'A1'`); n != 0 {
					t.Errorf("%d messages handled whose payload was shredded", n)
				}
				return
			}
			testenv.Eventually(t, 60*time.Second, func() error {
				if n := e.count(`SELECT count(*) FROM applied`); n != 3 {
					return fmt.Errorf("%d of 3 applied", n)
				}
				return nil
			})
			for _, ik := range []string{"A2", "A3"} {
				if n := e.count(`SELECT count(*) FROM applied WHERE ikey = $1 AND value = $2 AND secret = $3`, ik, secretValue(ik), secretHeader(ik)); n != 1 {
					t.Errorf("%s was not handled with its value and headers intact", ik)
				}
			}
		})
	}
}

// TestSealedDeferredMessages: with Defer and a key, deferred messages are
// sealed at rest; when due, the scheduler publishes them and the handler
// gets their value and headers intact; with their data key destroyed
// first, the scheduler dead-letters each as a stub and deletes its row,
// and the handler never sees them again.
func TestSealedDeferredMessages(t *testing.T) {
	t.Parallel()
	for _, destroyed := range []bool{false, true} {
		name := map[bool]string{false: "defer then publish", true: "key destroyed"}[destroyed]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			ctx := testenv.Context(t)
			t.Cleanup(func() { e.k.DeleteTopics(t, e.topic+"."+e.group+".deferred") })
			if _, err := e.pool.Exec(ctx, `CREATE TABLE applied(ikey text, value text, secret text)`); err != nil {
				t.Fatal(err)
			}
			cfg := e.config()
			cfg.Defer = &schedule.Scheduler{Pool: e.pool, MaxWait: 100 * time.Millisecond}
			cfg.EncryptionKey = sealtest.KEK(t)
			var mu sync.Mutex
			deferred := map[string]int{}
			h := handler.Func(func(ctx context.Context, m *handler.Message) error {
				mu.Lock()
				deferred[m.IdempotencyKey]++
				first := deferred[m.IdempotencyKey] == 1
				mu.Unlock()
				if first {
					return handler.DeferUntil(time.Now().Add(time.Hour)) // moved due by the test
				}
				secret, _ := m.Header("x-secret")
				_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO applied VALUES ($1, $2, $3)`, m.IdempotencyKey, string(m.Value), string(secret))
				return err
			})
			e.produceSecrets("d", "d1", "d2", "d3")
			start(t, cfg, h)
			testenv.Eventually(t, 60*time.Second, func() error { return e.countIs(`SELECT count(*) FROM idem_deferred`, 3) })
			if n := e.count(`SELECT count(*) FROM idem_deferred WHERE key_id IS NOT NULL AND sealed IS NOT NULL
				AND value IS NULL AND cardinality(header_keys) = 0 AND cardinality(header_values) = 0 AND dlq_topic = $1
				AND position('4111111111111111'::bytea IN sealed) = 0 AND position('hdr-secret'::bytea IN sealed) = 0`, e.dlq()); n != 3 {
				t.Fatalf("%d of 3 deferred rows sealed at rest", n)
			}
			if destroyed {
				sealtest.DestroyKeys(t, e.query, "deferred", `SELECT max(created_at) FROM idem_deferred`)
			}
			if _, err := e.query.Exec(ctx, `UPDATE idem_deferred SET due_at = now()`); err != nil {
				t.Fatal(err)
			}

			if destroyed {
				e.checkStubs("d1", "d2", "d3")
				testenv.Eventually(t, 60*time.Second, func() error {
					if n := e.count(`SELECT count(*) FROM idem_deferred`); n != 0 {
						return fmt.Errorf("%d deferred rows left", n)
					}
					if got := metricValue(t, e, "idem_schedule_dead_lettered_total", map[string]string{"group": e.group}); got != 3 {
						return fmt.Errorf("idem_schedule_dead_lettered_total %v, want 3", got)
					}
					return nil
				})
				if n := e.count(`SELECT count(*) FROM applied`); n != 0 {
					t.Errorf("%d deferred messages handled whose payload was shredded", n)
				}
				return
			}
			testenv.Eventually(t, 60*time.Second, func() error {
				if n := e.count(`SELECT count(*) FROM applied`); n != 3 {
					return fmt.Errorf("%d of 3 applied", n)
				}
				return nil
			})
			for _, ik := range []string{"d1", "d2", "d3"} {
				if n := e.count(`SELECT count(*) FROM applied WHERE ikey = $1 AND value = $2 AND secret = $3`, ik, secretValue(ik), secretHeader(ik)); n != 1 {
					t.Errorf("%s was not handled with its value and headers intact", ik)
				}
			}
		})
	}
}

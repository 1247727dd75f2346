package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// messagesOutcome is idem_messages_total{outcome} summed over topics.
func coreOutcome(t *testing.T, g prometheus.Gatherer, outcome string) int {
	t.Helper()
	return int(gatherSum(t, g, "idem_messages_total", map[string]string{"outcome": outcome}))
}

// claimed is idem_partitions_assigned of one member (its own registry).
func coreClaimed(t *testing.T, g prometheus.Gatherer) int {
	t.Helper()
	return int(gatherSum(t, g, "idem_partitions_assigned", nil))
}

// coreTokens gates a handler: each call takes one token before it writes its
// effect, so the test decides how far the stream may go. open lets every
// later call through.
type coreTokens struct {
	ch    chan struct{}
	once  sync.Once
	taken atomic.Int64
}

func coreNewTokens() *coreTokens { return &coreTokens{ch: make(chan struct{}, 100000)} }

func (g *coreTokens) release(n int) {
	for range n {
		g.ch <- struct{}{}
	}
}

func (g *coreTokens) open() { g.once.Do(func() { close(g.ch) }) }

func (g *coreTokens) take(ctx context.Context) error {
	select {
	case <-g.ch:
		g.taken.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// coreWaitProgress waits until the stream has moved n messages on: n
// committed effects, or, when messages commit in batches (the batch
// modes, where a batch waiting for a token holds back the effects of
// its members), n tokens taken.
func (e *env) coreWaitProgress(g *coreTokens, n int, timeout time.Duration) {
	e.t.Helper()
	if !strings.Contains(string(e.mode), "batch") {
		e.coreWaitEffects(n, timeout)
		return
	}
	testenv.Eventually(e.t, timeout, func() error {
		if got := g.taken.Load(); got < int64(n) {
			return fmt.Errorf("tokens taken = %d, waiting for %d", got, n)
		}
		return nil
	})
}

// gatedEffectHandler is effectHandler behind a token gate.
func coreGatedHandler(g *coreTokens) handler.Func {
	eff := effectHandler()
	return func(ctx context.Context, m *handler.Message) error {
		if err := g.take(ctx); err != nil {
			return err
		}
		return eff(ctx, m)
	}
}

// uniqueKeys returns n distinct keys.
func coreKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return keys
}

// waitEffects polls until the effects table holds at least n rows.
func (e *env) coreWaitEffects(n int, timeout time.Duration) {
	e.t.Helper()
	testenv.Eventually(e.t, timeout, func() error {
		if got := e.count(`SELECT count(*) FROM effects`); got < n {
			return fmt.Errorf("effects = %d, waiting for %d", got, n)
		}
		return nil
	})
}

// assertOneEffectPerKey checks that exactly uniq distinct keys have effects,
// each exactly once.
func (e *env) coreAssertOnePerKey(uniq int) {
	e.t.Helper()
	if got := e.count(`SELECT count(*) FROM effects`); got != uniq {
		doubles := e.count(`SELECT count(*) FROM (SELECT key FROM effects GROUP BY key HAVING count(*) > 1) d`)
		e.t.Errorf("effects = %d, want %d (one per unique key); keys with more than one effect: %d", got, uniq, doubles)
	}
	if got := e.count(`SELECT count(DISTINCT key) FROM effects`); got != uniq {
		e.t.Errorf("distinct effect keys = %d, want %d (keys without an effect: %d)", got, uniq, uniq-got)
	}
	// idem's own rows (a hook's run, a deferral: "idem:…") are not messages.
	if got := e.count(`SELECT count(*) FROM idem_processed WHERE consumer_group = $1 AND idempotency_key NOT LIKE 'idem:%'`, e.group); got != uniq {
		e.t.Errorf("inbox rows = %d, want %d", got, uniq)
	}
}

// readRecords reads n records of topic/partition from the oldest offset.
func (e *env) coreReadRecords(topic string, partition int32, n int, timeout time.Duration) []*sarama.ConsumerMessage {
	e.t.Helper()
	c, err := sarama.NewConsumer(e.k.Brokers, e.k.SaramaConfig())
	if err != nil {
		e.t.Fatalf("consumer: %v", err)
	}
	defer c.Close()
	pc, err := c.ConsumePartition(topic, partition, sarama.OffsetOldest)
	if err != nil {
		e.t.Fatalf("consume %s/%d: %v", topic, partition, err)
	}
	defer pc.Close()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var out []*sarama.ConsumerMessage
	for len(out) < n {
		select {
		case m := <-pc.Messages():
			out = append(out, m)
		case err := <-pc.Errors():
			e.t.Fatalf("consume %s/%d: %v", topic, partition, err)
		case <-deadline.C:
			e.t.Fatalf("read %d of %d records of %s/%d within %s", len(out), n, topic, partition, timeout)
		}
	}
	return out
}

func coreHeader(m *sarama.ConsumerMessage, key string) (string, bool) {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if h := m.Headers[i]; h != nil && string(h.Key) == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// schema returns the PostgreSQL schema the test's pool uses.
func (e *env) coreSchema() string {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), `SELECT current_schema()`).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// A handler fails once and then succeeds. After the failure the inbox
// holds no row for the key (the failed attempt's transaction rolled back, so a
// retry is not mistaken for a duplicate); the row appears only with the
// successful attempt, and there is exactly one effect.
func TestFailThenSucceedRecordsKeyOnlyOnSuccess(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		e := newEnv(t, 1).in(mode)
		const key = "flaky-1"
		e.produce([]string{key}, 1)

		entered := make(chan struct{})
		release := make(chan struct{})
		var (
			mu       sync.Mutex
			attempts []int
			inTx     = -1
		)
		eff := effectHandler()
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			mu.Lock()
			attempts = append(attempts, m.Attempt)
			n := len(attempts)
			mu.Unlock()
			if n == 1 {
				return errors.New("transient failure")
			}
			if n == 2 {
				close(entered)
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			// Inside the transaction the attempt's own inbox row is visible.
			var c int
			if err := dedupe.Tx(ctx).QueryRow(ctx, `SELECT count(*) FROM idem_processed WHERE idempotency_key = $1`, key).Scan(&c); err != nil {
				return err
			}
			mu.Lock()
			inTx = c
			mu.Unlock()
			return eff(ctx, m)
		})
		start(t, e.config(), h)

		select {
		case <-entered:
		case <-time.After(60 * time.Second):
			t.Fatal("the handler was not called a second time")
		}
		// The second attempt is blocked: the first one failed and rolled back.
		if got := e.count(`SELECT count(*) FROM idem_processed WHERE consumer_group = $1 AND idempotency_key = $2`, e.group, key); got != 0 {
			t.Errorf("after the failed attempt the inbox has %d rows for the key, want 0", got)
		}
		if got := e.count(`SELECT count(*) FROM effects`); got != 0 {
			t.Errorf("after the failed attempt effects = %d, want 0", got)
		}
		close(release)

		e.waitCommitted(e.topic, 1, 60*time.Second)
		if got := e.count(`SELECT count(*) FROM idem_processed WHERE consumer_group = $1 AND idempotency_key = $2`, e.group, key); got != 1 {
			t.Errorf("after success the inbox has %d rows for the key, want 1", got)
		}
		if got := e.count(`SELECT count(*) FROM effects WHERE key = $1`, key); got != 1 {
			t.Errorf("effects = %d, want 1", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(attempts) != "[1 2]" {
			t.Errorf("handler saw Attempt %v, want [1 2]", attempts)
		}
		if inTx != 1 {
			t.Errorf("inside the successful attempt's transaction the inbox row count was %d, want 1", inTx)
		}
		for _, c := range []struct {
			name   string
			labels map[string]string
			want   float64
		}{
			{"idem_handler_attempts_total", map[string]string{"result": coremetrics.ResultError}, 1},
			{"idem_handler_attempts_total", map[string]string{"result": coremetrics.ResultOK}, 1},
			{"idem_retries_total", nil, 1},
			{"idem_messages_total", map[string]string{"outcome": coremetrics.OutcomeProcessed}, 1},
			{"idem_messages_total", map[string]string{"outcome": coremetrics.OutcomeDeadLettered}, 0},
		} {
			if got := gatherSum(t, e.reg, c.name, c.labels); got != c.want {
				t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
			}
		}
	})
}

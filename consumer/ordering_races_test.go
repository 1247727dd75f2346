package consumer_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// orderedEnv is an env whose config orders by key, with an applied table the
// handlers write to in their transaction.
func orderedEnv(t *testing.T, partitions int32, delay time.Duration) (*env, consumer.Config) {
	t.Helper()
	e := newEnv(t, partitions)
	ctx := testenv.Context(t)
	if err := schema.Migrate(ctx, e.pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE applied(seq bigserial primary key, ikey text)`); err != nil {
		t.Fatal(err)
	}
	cfg := e.config()
	cfg.Retry.Attempts = 1
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{delay}}
	cfg.Ordering = consumer.ByKey(e.pool)
	return e, cfg
}

// apply records m as applied in the message's transaction.
func apply(ctx context.Context, m *handler.Message) error {
	_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO applied(ikey) VALUES ($1)`, m.IdempotencyKey)
	return err
}

func (e *env) applied() string {
	e.t.Helper()
	var s *string
	if err := e.pool.QueryRow(context.Background(), `SELECT string_agg(ikey, ',' ORDER BY seq) FROM applied`).Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	if s == nil {
		return ""
	}
	return *s
}

func (e *env) orderingRows() int {
	return e.count(`SELECT count(*) FROM idem_ordering_heads`) + e.count(`SELECT count(*) FROM idem_ordering_parked`)
}

// waitSettled waits until the applied keys are one of want and no ordering
// row is left.
func (e *env) waitSettled(want ...string) {
	e.t.Helper()
	testenv.Eventually(e.t, 60*time.Second, func() error {
		if got := e.applied(); !slices.Contains(want, got) {
			return fmt.Errorf("applied %q, want one of %q", got, want)
		}
		if n := e.orderingRows(); n != 0 {
			return fmt.Errorf("%d ordering rows left", n)
		}
		return nil
	})
}

// send produces one record with Kafka key key and idempotency key ikey.
func (e *env) send(p sarama.SyncProducer, partition int32, key []byte, ikey string) {
	e.t.Helper()
	if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: partition, Key: sarama.ByteEncoder(key),
		Value: sarama.StringEncoder(ikey), Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(ikey)}}}); err != nil {
		e.t.Fatal(err)
	}
}

// block makes head the head of key (in tier) with parked behind it, as a
// consumer would have left them; the parked records are not in Kafka.
func (e *env) block(key []byte, head string, tier int, parked ...string) {
	e.t.Helper()
	ctx := testenv.Context(e.t)
	s := keyorder.New(e.pool, e.group)
	if err := s.BlockTier(ctx, e.topic, key, head, tier); err != nil {
		e.t.Fatal(err)
	}
	for i, ik := range parked {
		st, err := s.Park(ctx, keyorder.Record{Topic: e.topic, Key: key, IdempotencyKey: ik, Offset: int64(1000 + i),
			Timestamp: time.Now(), Value: []byte(ik), Headers: []keyorder.Header{{Key: "idempotency-key", Value: []byte(ik)}}})
		if err != nil || st != keyorder.Blocked {
			e.t.Fatalf("park %s: %v, %v", ik, st, err)
		}
	}
}

// calls counts handler calls per idempotency key.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) inc(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[k]++
	return c.n[k]
}

func (c *calls) get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[k]
}

// Issue 8: a drain promotes A2 (its forward pending) and its partition is
// revoked before the send. The member that takes the partition over in the
// cooperative rebalance — running since before A2 was promoted, so no
// start-up recovery sees it — forwards A2 when it claims the partition, and A
// is applied in order: A1, A2, A3.
func TestOrderingRevokeBetweenPromoteAndSend(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
	cfg.ShutdownGrace = 300 * time.Millisecond
	var c calls
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if n := c.inc(m.IdempotencyKey); n == 1 && (m.IdempotencyKey == "A1" || m.IdempotencyKey == "A2") {
			return errors.New("first try fails")
		}
		return apply(ctx, m)
	})
	promotedBy := make(chan int, 1)
	var once sync.Once
	members := make([]*running, 2)
	for i := range members {
		mcfg := cfg
		mcfg.Registerer = prometheus.NewRegistry()
		ctx := consumer.WithOrderHooks(context.Background(), func(stop, hctx context.Context, r keyorder.Record) {
			blocked := false
			once.Do(func() { blocked = true })
			if blocked && r.IdempotencyKey == "A2" {
				promotedBy <- i
				<-hctx.Done() // revoked: the grace runs out before the send
			}
		}, nil)
		members[i] = startCtx(t, ctx, mcfg, h)
	}
	p := e.k.Producer(t)
	for _, ik := range []string{"A1", "A2", "A3"} {
		e.send(p, 0, []byte("A"), ik)
	}
	var owner int
	select {
	case owner = <-promotedBy:
	case <-time.After(60 * time.Second):
		t.Fatal("A2 was never promoted")
	}
	if err := members[owner].stop(); err != nil {
		t.Fatal(err)
	}
	e.waitSettled("A1,A2,A3")
	if n := e.total(e.tier(1), 1); n < 2 {
		t.Fatalf("tier 1 has %d records, want A1 and A2", n)
	}
}

// gated wraps a dedupe store and reports each Process call's key.
type gated struct {
	dedupe.Store
	mu      sync.Mutex
	entered map[string]int
}

func (g *gated) Process(ctx context.Context, rec dedupe.Record, fn func(ctx context.Context) error) (dedupe.Outcome, error) {
	g.mu.Lock()
	if g.entered == nil {
		g.entered = map[string]int{}
	}
	g.entered[rec.Key]++
	g.mu.Unlock()
	return g.Store.Process(ctx, rec, fn)
}

func (g *gated) count(k string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.entered[k]
}

// waitFor polls cond until it holds or ctx ends.
func waitFor(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// Issue 8: two copies of head H (a redelivery racing its tier record, here
// one on each partition) are handled at once and both drain K: both read
// parked M, both fail it, both try to promote it. Exactly one promotion and
// one forward of M happen; the loser stops draining (no retry loop) and its
// copy of H is committed.
func TestOrderingTwoCopiesOfOneHead(t *testing.T) {
	t.Parallel()
	forEachMode(t, orderingModes, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 2, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		g := &gated{Store: cfg.Dedupe}
		cfg.Dedupe = g
		key := []byte("K")
		e.block(key, "H", 1, "M")
		var c calls
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey != "M" {
				return apply(ctx, m)
			}
			switch c.inc("M") {
			case 1: // the first drain: wait until the second drain reached M too
				if err := waitFor(ctx, func() bool { return g.count("M") >= 2 }); err != nil {
					return err
				}
				return errors.New("M fails")
			case 2: // the second drain: fail only after the first promoted M
				if err := waitFor(ctx, func() bool {
					var head string
					_ = e.pool.QueryRow(ctx, `SELECT head_key FROM idem_ordering_heads`).Scan(&head)
					return head == "M"
				}); err != nil {
					return err
				}
				return errors.New("M fails again")
			}
			return apply(ctx, m)
		})
		if err := e.runOnBoth(cfg, h, key, [2]string{"H", "H"}, "H,M").stop(); err != nil {
			t.Fatal(err)
		}
		// Counted by a read_committed reader: with Transactions the end
		// offsets count the commit markers too.
		if n := len(e.records(e.tier(1), sarama.ReadCommitted)); n != 1 {
			t.Errorf("tier 1 got %d records, want M once", n)
		}
		if n := c.get("M"); n != 3 {
			t.Errorf("M handled %d times, want 3 (two failing drains, then from the tier)", n)
		}
	})
}

// runOnBoth sends ikeys[i] with Kafka key key to partition i, runs cfg and h,
// and waits until the applied keys are one of want, no ordering row is left
// and every offset is committed; nothing may have been retried as an outage.
// It returns the running consumer.
func (e *env) runOnBoth(cfg consumer.Config, h handler.Handler, key []byte, ikeys [2]string, want ...string) *running {
	e.t.Helper()
	p := e.k.Producer(e.t)
	for i, ik := range ikeys {
		e.send(p, int32(i), key, ik)
	}
	r := start(e.t, cfg, h)
	e.waitSettled(want...)
	e.waitCommitted(e.topic, 2, 30*time.Second)
	if n := metricValue(e.t, e, "idem_store_errors_total", nil); n != 0 {
		e.t.Errorf("idem_store_errors_total = %v: a conflict or a refused step was retried as an outage", n)
	}
	return r
}

// Issue 8: N and M of one Kafka key arrive on two partitions, both fail at
// once and both try to become the head. The key is 8 KiB of random bytes,
// far above what a btree index entry holds. One becomes the head; the other
// goes to its tier anyway and, back from it, is parked behind the head or
// processed: both are applied once, nothing loops, no row is left.
func TestOrderingBlockRaceOnLongKey(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 2, 200*time.Millisecond)
	key := make([]byte, 8<<10)
	_, _ = rand.Read(key)
	var c calls
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if c.inc(m.IdempotencyKey) == 1 {
			if err := waitFor(ctx, func() bool { return c.get("N") >= 1 && c.get("M") >= 1 }); err != nil {
				return err
			}
			return errors.New("first try fails")
		}
		return apply(ctx, m)
	})
	e.runOnBoth(cfg, h, key, [2]string{"N", "M"}, "N,M", "M,N")
}

// Issue 8: once a partition is stopping, its drain starts no new parked
// message, even within the shutdown grace: P1 (running when the stop came)
// finishes, P2… stay parked behind the unmarked head, whose redelivery drains
// them in order after a restart.
func TestOrderingDrainStopsOnRevoke(t *testing.T) {
	t.Parallel()
	forEachMode(t, orderingModes, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 200*time.Millisecond)
		e.in(mode)
		cfg = mode.apply(cfg)
		cfg.ShutdownGrace = 30 * time.Second
		key := []byte("K")
		e.block(key, "H", 1, "P1", "P2", "P3")
		stops := make(chan context.Context, 1)
		running := make(chan struct{})
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey == "P1" {
				stop := <-stops
				close(running)
				<-stop.Done() // the partition is stopping; P1 itself may still finish
			}
			return apply(ctx, m)
		})
		ctx := consumer.WithOrderHooks(context.Background(), nil, func(stop, _ context.Context, r keyorder.Record) {
			if r.IdempotencyKey == "P1" {
				stops <- stop
			}
		})
		e.send(e.k.Producer(t), 0, key, "H")
		first := startCtx(t, ctx, cfg, h)
		select {
		case <-running:
		case <-time.After(60 * time.Second):
			t.Fatal("P1 never started")
		}
		if err := first.stop(); err != nil {
			t.Fatal(err)
		}
		if got := e.applied(); got != "H,P1" {
			t.Fatalf("applied %q by the stopping member, want H,P1 (nothing started after the stop)", got)
		}
		if n := e.count(`SELECT count(*) FROM idem_ordering_parked`); n != 2 {
			t.Fatalf("%d parked, want P2 and P3", n)
		}
		start(t, cfg, handler.Func(apply))
		e.waitSettled("H,P1,P2,P3")
	})
}

// Issue 8: Run warns at start about parked messages of its group it will not
// read — ordering switched off, or heads in a tier the policy no longer has —
// naming the topic, the counts and the release command.
func TestOrderingWarnsAboutUnreadParked(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		mutate  func(*consumer.Config)
		tier    int
		promote bool // P1 promoted to head, its forward to tier 3 pending
		parked  string
		reason  string
	}{
		{"ordering off", func(c *consumer.Config) { c.Ordering = consumer.Ordering{} }, 1, false, "parked=3", "ordering is off"},
		{"tier removed", func(c *consumer.Config) {}, 3, true, "parked=2", "retry tier 3, but Retry.Tiers.Delays has 1 tiers"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, cfg := orderedEnv(t, 1, time.Second)
			e.block([]byte("K"), "H", tt.tier, "P1", "P2")
			e.block([]byte("L"), "G", tt.tier, "Q1")
			if tt.promote {
				// Forwarding it would fail (tier 3's topic does not exist)
				// and nothing would read it: Run starts, leaves it, warns.
				s := keyorder.New(e.pool, e.group)
				next, _, err := s.Next(testenv.Context(t), e.topic, []byte("K"), "H")
				if err != nil {
					t.Fatal(err)
				}
				next.Tier = 3
				if err := s.Promote(testenv.Context(t), "H", next); err != nil {
					t.Fatal(err)
				}
			}
			tt.mutate(&cfg)
			var logs logBuffer
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			start(t, cfg, handler.Func(apply))
			testenv.Eventually(t, 30*time.Second, func() error {
				out := logs.String()
				for _, want := range []string{"level=WARN", "will not read", "topic=" + e.topic, "keys=2", tt.parked, tt.reason,
					"idem ordering release --group " + e.group + " --topic " + e.topic + " --all"} {
					if !strings.Contains(out, want) {
						return fmt.Errorf("log lacks %q:\n%s", want, out)
					}
				}
				return nil
			})
		})
	}
}

// Issue 8: a step the ordering store refuses deterministically (here a CHECK
// constraint, SQLSTATE 23514, on parking one message) is not retried as an
// outage: the message it concerns is processed unordered, the partition moves
// on, and the key's other messages are still parked behind their head.
func TestOrderingRefusedStepDoesNotLoop(t *testing.T) {
	t.Parallel()
	e, cfg := orderedEnv(t, 1, time.Second)
	ctx := testenv.Context(t)
	if _, err := e.pool.Exec(ctx, `ALTER TABLE idem_ordering_parked ADD CONSTRAINT refuse_bad CHECK (idempotency_key <> 'BAD')`); err != nil {
		t.Fatal(err)
	}
	key := []byte("K")
	e.block(key, "H", 1) // H waits in tier 1 (not in Kafka): K is blocked
	p := e.k.Producer(t)
	for _, ik := range []string{"BAD", "OK"} {
		e.send(p, 0, key, ik)
	}
	start(t, cfg, handler.Func(apply))
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := e.applied(); got != "BAD" {
			return fmt.Errorf("applied %q, want BAD (processed unordered) only", got)
		}
		if n := e.count(`SELECT count(*) FROM idem_ordering_parked WHERE idempotency_key='OK'`); n != 1 {
			return fmt.Errorf("OK not parked (%d)", n)
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 30*time.Second)
	if n := metricValue(t, e, "idem_store_errors_total", nil); n != 0 {
		t.Errorf("idem_store_errors_total = %v: the refused step was retried as an outage", n)
	}
}

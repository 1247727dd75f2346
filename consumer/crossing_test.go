package consumer_test

// Crossing tests of issue 28 without Transactions, or in every mode.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/schedule"
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

// Defect 6: a message's copies keep where and when it was first produced.
// D is deferred at its source; its deferred copy arrives while its key is
// blocked behind H (in a tier) and is parked, then drained. E is deferred,
// and its deferred copy fails into tier 1. Every handler call of D and E
// must see Origin() as the source record: its topic, partition, offset and
// timestamp (expiry by age measures from it), not a copy's.
func TestCrossingCopiesKeepTheirOrigin(t *testing.T) {
	t.Parallel()
	forEachMode(t, orderingModes, func(t *testing.T, mode testMode) {
		e, cfg := orderedEnv(t, 1, 3*time.Second)
		e.in(mode)
		cfg = mode.apply(cfg)
		cfg.Defer = &schedule.Scheduler{Pool: e.pool}
		t.Cleanup(func() { e.k.DeleteTopics(t, e.topic+"."+e.group+".deferred") })
		ts0 := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
		var mu sync.Mutex
		seen := map[string][]handler.Origin{}
		var c calls
		h := handler.Func(func(ctx context.Context, m *handler.Message) error {
			n := c.inc(m.IdempotencyKey)
			mu.Lock()
			seen[m.IdempotencyKey] = append(seen[m.IdempotencyKey], m.Origin())
			mu.Unlock()
			switch {
			case (m.IdempotencyKey == "D" || m.IdempotencyKey == "E") && n == 1:
				return handler.DeferUntil(time.Now().Add(time.Second))
			case m.IdempotencyKey == "E" && n == 2: // its deferred copy
				return errors.New("E's copy fails")
			case m.IdempotencyKey == "H" && m.Topic == e.topic:
				return errors.New("H fails at its source")
			}
			return apply(ctx, m)
		})
		p := e.k.Producer(t)
		offsets := map[string]int64{}
		for _, r := range []struct{ ikey, key string }{{"D", "K"}, {"H", "K"}, {"E", "K2"}} {
			_, off, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder(r.key), Value: sarama.StringEncoder(r.ikey),
				Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(r.ikey)}}, Timestamp: ts0})
			if err != nil {
				t.Fatal(err)
			}
			offsets[r.ikey] = off
		}
		r := start(t, cfg, h)
		testenv.Eventually(t, 90*time.Second, func() error {
			for _, want := range []string{"D", "E", "H"} {
				if !strings.Contains(","+e.applied()+",", ","+want+",") {
					return fmt.Errorf("applied %q, want D, E and H", e.applied())
				}
			}
			return nil
		})
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
		if n := e.orderingRows(); n != 0 { // a key left blocked
			t.Errorf("%d ordering rows left", n)
		}
		if c.get("D") < 2 || c.get("E") < 3 {
			t.Fatalf("D handled %d times, E %d: the copies did not take their paths", c.get("D"), c.get("E"))
		}
		mu.Lock()
		defer mu.Unlock()
		for _, ik := range []string{"D", "E"} {
			want := handler.Origin{Topic: e.topic, Partition: 0, Offset: offsets[ik], Timestamp: ts0}
			for i, o := range seen[ik] {
				if o.Topic != want.Topic || o.Partition != want.Partition || o.Offset != want.Offset || !o.Timestamp.Equal(want.Timestamp) {
					t.Errorf("%s, call %d: Origin() = %+v, want %+v", ik, i+1, o, want)
				}
			}
		}
	})
}

// Defect 8: Config.Limits.Adaptive bounds the member's handler attempts in
// flight, batches included. With a limit of one (Min = Max = 1) and four
// partitions batching at once, never more than one batch may be in its
// handler. Drawn: a handler.Batch handler or a per-message one.
func TestCrossingBatchesHonourAdaptiveLimit(t *testing.T) {
	t.Parallel()
	for _, batchHandler := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch-handler=%v", batchHandler), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 4)
			cfg := e.config()
			cfg.Batch = consumer.BatchConfig{MaxMessages: 20, MaxWait: 20 * time.Millisecond}
			cfg.Limits.Adaptive = &consumer.Adaptive{Min: 1, Max: 1}
			var inFlight, most atomic.Int32
			call := func() {
				n := inFlight.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				select { // a dependency call
				case <-time.After(30 * time.Millisecond):
				case <-t.Context().Done():
				}
				inFlight.Add(-1)
			}
			eff := effectHandler()
			var h handler.Handler = handler.Func(func(ctx context.Context, m *handler.Message) error {
				call()
				return eff(ctx, m)
			})
			if batchHandler {
				h = handler.Batch(func(ctx context.Context, ms []*handler.Message) error {
					call()
					for _, m := range ms {
						if err := eff(ctx, m); err != nil {
							return err
						}
					}
					return nil
				})
			}
			e.produce(coreKeys("k", 400), 4)
			r := start(t, cfg, h)
			e.coreWaitEffects(400, 90*time.Second)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
			if n := most.Load(); n > 1 {
				t.Errorf("%d handler calls in flight at once, the adaptive limit being 1", n)
			}
		})
	}
}

// Defect 9: breaker A opened and closed the gate (every partition paused).
// The half-open probe then met a 429 of dependency B, which says nothing of
// A: the gate must not close again for B's Retry-After. A message of
// another partition, needing only A, is handled at once; only the message
// needing B waits for it.
func TestCrossingThrottledProbeDoesNotPauseTheMember(t *testing.T) {
	t.Parallel()
	const retryAfter = 20 * time.Second
	e := newEnv(t, 2)
	set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var aFailed, bThrottled atomic.Bool
	var yAt atomic.Int64
	eff := effectHandler()
	cfg := e.config()
	cfg.Limits.Breakers = set
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if err := set.Do(ctx, "A", func(context.Context) error {
			if aFailed.CompareAndSwap(false, true) {
				return errors.New("A: 503") // opens A's breaker: the gate closes
			}
			return nil
		}); err != nil {
			return err
		}
		if m.IdempotencyKey == "x" { // x needs B too: the probe meets B's 429
			if err := set.Do(ctx, "B", func(context.Context) error {
				if bThrottled.CompareAndSwap(false, true) {
					return handler.RetryAfter(errors.New("B: 429"), retryAfter)
				}
				return nil
			}); err != nil {
				return err
			}
		}
		if m.IdempotencyKey == "y" {
			yAt.Store(time.Now().UnixNano())
		}
		return eff(ctx, m)
	})
	p := e.k.Producer(t)
	e.send(p, 0, []byte("x"), "x")
	r := start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if !bThrottled.Load() {
			return errors.New("the probe has not met B's 429 yet")
		}
		return nil
	})
	sent := time.Now()
	e.send(p, 1, []byte("y"), "y")
	e.coreWaitEffects(1, 60*time.Second)
	if got := time.Duration(yAt.Load() - sent.UnixNano()); got > retryAfter/2 {
		t.Errorf("y, needing only A, was handled %v after it was sent: the probe's 429 from B paused the member", got.Round(time.Millisecond))
	}
	e.coreWaitEffects(2, 60*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
}

// Earlier item: idem_partition_stalled_seconds counts failing, not waiting:
// a message waiting out an open breaker's cool-down or a dependency's 429
// is not a stall (Config.StallWarning's doc). Drawn: the breaker or the 429.
func TestCrossingBreakerWaitsAreNoStall(t *testing.T) {
	t.Parallel()
	for _, throttle := range []bool{false, true} {
		t.Run(fmt.Sprintf("throttle=%v", throttle), func(t *testing.T) {
			t.Parallel()
			const wait = 3 * time.Second
			e := newEnv(t, 1)
			set, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: wait})
			if err != nil {
				t.Fatal(err)
			}
			var failed, waiting atomic.Bool
			eff := effectHandler()
			cfg := e.config()
			cfg.StallWarning = 400 * time.Millisecond // stalls sampled every 100 ms
			cfg.Limits.Breakers = set
			r := start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
				if err := set.Do(ctx, "dep", func(context.Context) error {
					if !failed.CompareAndSwap(false, true) {
						return nil
					}
					waiting.Store(true)
					if throttle {
						return handler.RetryAfter(errors.New("dep: 429"), wait)
					}
					return errors.New("dep: 503") // opens the breaker for its cool-down
				}); err != nil {
					return err
				}
				return eff(ctx, m)
			}))
			e.produce([]string{"k"}, 1)
			testenv.Eventually(t, 60*time.Second, func() error {
				if !waiting.Load() {
					return errors.New("not waiting yet")
				}
				return nil
			})
			deadline := time.Now().Add(wait - 500*time.Millisecond)
			for time.Now().Before(deadline) {
				if v := metricValue(t, e, "idem_partition_stalled_seconds", map[string]string{"topic": e.topic}); v > 0 {
					t.Fatalf("idem_partition_stalled_seconds = %v while the message waits for its dependency", v)
				}
				select {
				case <-time.After(50 * time.Millisecond): // sampling the gauge, not synchronising
				case <-t.Context().Done():
				}
			}
			e.coreWaitEffects(1, 60*time.Second)
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Earlier item: tables.Defer's doc promised that a consumer stores a
// deferred message in the transaction that records its outcome ("stored
// and settled, or neither"). It does not: the deferral commits before the
// offset is marked, so the record can be read again after its deferral (a
// crash, here the group's offsets deleted). The deferral is recorded in the
// inbox (issue 28, phase 2: an outcome is decided once), so the
// redelivery, deferred again by its handler, is not stored a second time:
// one copy arrives, and it is applied once. The handler defers by an hour
// and the test releases the row (releaseDeferred) only after the
// redelivery was deferred: with a deferral of 2 s, the copy came due on a
// loaded machine before the redelivery was read, was applied first, and
// the redelivery was then a duplicate its handler never saw ("deferred 1
// times, want 2").
func TestCrossingRedeliveredDeferralIsStoredOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	if err := schema.Migrate(testenv.Context(t), e.pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.k.DeleteTopics(t, e.topic+"."+e.group+".deferred") })
	var c calls
	eff := effectHandler()
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Topic == e.topic { // at its source, every time: deferred
			c.inc("deferred")
			return handler.DeferUntil(time.Now().Add(time.Hour))
		}
		c.inc("copy")
		return eff(ctx, m)
	})
	cfg := e.config()
	cfg.Defer = e.deferScheduler()
	e.produce([]string{"d"}, 1)
	first := start(t, cfg, h)
	e.waitCommitted(e.topic, 1, 60*time.Second)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
	// Read again, as after a crash before the offset's commit.
	if err := e.k.Admin(t).DeleteConsumerGroupOffset(e.group, e.topic, 0); err != nil {
		t.Fatal(err)
	}
	cfg.Registerer = prometheus.NewRegistry()
	start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if c.get("deferred") < 2 {
			return fmt.Errorf("deferred %d times, want 2 (the redelivery too)", c.get("deferred"))
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 60*time.Second) // the redelivery settled
	if n := e.count(`SELECT count(*) FROM idem_deferred`); n != 1 {
		t.Fatalf("%d deferred rows after the redelivery, want 1 (stored once)", n)
	}
	e.releaseDeferred()
	deferred := e.topic + "." + e.group + ".deferred"
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.total(deferred, 1); n != 1 {
			return fmt.Errorf("%d deferred copies published, want 1 (deferred %d times)", n, c.get("deferred"))
		}
		if n := e.count(`SELECT count(*) FROM idem_deferred`); n != 0 {
			return fmt.Errorf("%d deferred rows left", n)
		}
		return nil
	})
	e.waitCommitted(deferred, 1, 60*time.Second)
	if n := e.count(`SELECT count(*) FROM effects`); n != 1 || c.get("copy") != 1 {
		t.Errorf("%d effects of %d handler calls, want 1 of 1 (the second copy a duplicate)", n, c.get("copy"))
	}
}

// Earlier item: Run splits Config.Limits.Breakers' budget across the
// group's members as they come and go (LimitsConfig.Breakers' doc; the
// payments example's README said it did not). Three members take a third
// each; when one leaves, the two left take half each.
func TestCrossingShareFollowsTheGroup(t *testing.T) {
	t.Parallel()
	const rate = 300.0
	e := newEnv(t, 6)
	sets := make([]*breaker.Set, 3)
	runs := make([]*running, 3)
	for i := range sets {
		set, err := breaker.NewSet(breaker.Settings{})
		if err != nil {
			t.Fatal(err)
		}
		if err := set.SetLimits("bank", breaker.Limits{Rate: rate}); err != nil {
			t.Fatal(err)
		}
		sets[i] = set
		cfg := e.config()
		cfg.Registerer = prometheus.NewRegistry()
		cfg.Limits.Breakers = set
		runs[i] = start(t, cfg, handler.Func(func(context.Context, *handler.Message) error { return nil }))
	}
	shares := func(members int) {
		t.Helper()
		testenv.Eventually(t, 90*time.Second, func() error {
			for i, s := range sets[:members] {
				if r := s.LimitStates()["bank"].Rate; r < rate/float64(members)-0.01 || r > rate/float64(members)+0.01 {
					return fmt.Errorf("member %d: rate %.2f, want %.2f", i, r, rate/float64(members))
				}
			}
			return nil
		})
	}
	shares(3)
	if err := runs[2].stop(); err != nil {
		t.Fatal(err)
	}
	shares(2)
}

// Earlier item: a member whose pool holds fewer connections than its
// partitions (retry tiers included) times its lanes starved silently (a
// trial took 1–2.5 s per handler call: a pool of 4, 9 partitions). Run
// warns when a session starts (at start, and after each rebalance), naming
// the pool's size, the partitions, the tiers' among them, and the lanes.
func TestCrossingSmallPoolWarns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	var logs logBuffer
	cfg := e.config()
	cfg.Dedupe = dedupe.NewPostgres(e.query) // 4 connections
	cfg.Concurrency = 2
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second, time.Second}}
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	first := start(t, cfg, handler.Func(func(context.Context, *handler.Message) error { return nil }))
	const warn = "idem: the database pool holds fewer connections than this member's lanes"
	testenv.Eventually(t, 60*time.Second, func() error {
		if !strings.Contains(logs.String(), warn) {
			return errors.New("no warning yet")
		}
		return nil
	})
	for _, want := range []string{"pool_size=4", "partitions=9", "tier_partitions=6", "lanes=2", "needed=18"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the warning does not name %s:\n%s", want, logs.String())
		}
	}
	// A second member joins: the first one's partitions are rebalanced, and
	// its new session warns again with its new numbers.
	cfg2 := e.config()
	cfg2.Retry.Tiers = cfg.Retry.Tiers
	cfg2.Registerer = prometheus.NewRegistry()
	start(t, cfg2, handler.Func(func(context.Context, *handler.Message) error { return nil }))
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := strings.Count(logs.String(), warn); n < 2 {
			return fmt.Errorf("%d warnings, want one more after the rebalance", n)
		}
		return nil
	})
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
}

// Earlier item: a rule's dead-letter topic is one topic whatever the
// source; shared by sources of 3 and 6 partitions, it failed Run's start
// (its partitions could not match both sources). A dead-letter topic needs
// no partition of its own per source partition (nothing reads it in key
// order): Run creates it with the most partitions, or, when it exists with
// fewer (made by an earlier run), warns and sends the records of the
// partitions it lacks by their key. Poison of both sources reaches it.
func TestCrossingRuleDLQSharedBySources(t *testing.T) {
	t.Parallel()
	for _, existing := range []int32{0, 3} {
		t.Run(fmt.Sprintf("existing-partitions=%d", existing), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 3)
			big := e.k.Topic(t, 6)
			shared := e.topic + ".dlq.shared"
			t.Cleanup(func() { e.k.DeleteTopics(t, shared, big+"."+e.group+".dlq") })
			parts := int32(6)
			if existing > 0 {
				e.k.CreateTopic(t, shared, existing)
				parts = existing
			}
			errPoison := errors.New("poison")
			cfg := e.config()
			cfg.Topics = []string{e.topic, big}
			cfg.Retry.Rules = []recovery.Rule{{Name: "poison", Match: recovery.Is(errPoison), DLQ: shared}}
			r := start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
				return fmt.Errorf("charge: %w", errPoison)
			}))
			p := e.k.Producer(t)
			for _, dest := range []struct {
				topic string
				part  int32
			}{{e.topic, 2}, {big, 5}} {
				if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: dest.topic, Partition: dest.part, Key: sarama.StringEncoder(dest.topic), Value: sarama.StringEncoder("x"),
					Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(dest.topic)}}}); err != nil {
					t.Fatal(err)
				}
			}
			testenv.Eventually(t, 90*time.Second, func() error {
				select {
				case err := <-r.done:
					r.done <- err
					t.Fatalf("Run returned %v", err)
				default:
				}
				if n := e.total(shared, parts); n != 2 {
					return fmt.Errorf("the shared DLQ holds %d records, want 2", n)
				}
				return nil
			})
			if err := r.stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A re-drive of a deferred record (found reading the round's diff): the
// handler defers d at its first delivery and again when an operator
// re-drives the window holding d. Each epoch is a key space of its own
// (dedupe.Record.Epoch), so the re-drive's deferral is stored too, not
// taken for the first one's duplicate and dropped.
func TestCrossingRedriveOfDeferredRecord(t *testing.T) {
	t.Parallel()
	const partitions = 1
	e := newControlEnv(t, partitions)
	if err := schema.Migrate(testenv.Context(t), e.pool, nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.k.DeleteTopics(t, e.topic+"."+e.group+".deferred") })
	var c calls
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		if m.Topic == e.topic { // at its source, in every epoch: deferred
			c.inc(fmt.Sprint("deferred in epoch ", m.Epoch))
			return handler.DeferUntil(time.Now().Add(time.Hour))
		}
		return nil
	})
	now := time.Now()
	e.produceAt([]string{"d"}, partitions, func(int) time.Time { return now.Add(-10 * time.Minute) })
	cfg := e.config()
	cfg.Defer = e.deferScheduler()
	cfg.Controls = e.pool
	startCtx(t, consumer.WithControlsTiming(context.Background(), 200*time.Millisecond, time.Second), cfg, h)
	e.waitCommitted(e.topic, partitions, 60*time.Second)
	if n := e.count(`SELECT count(*) FROM idem_deferred`); n != 1 {
		t.Fatalf("%d deferred rows after the first delivery, want 1", n)
	}
	rd := e.redrive(e.client(), now.Add(-time.Hour), now, 0, 0)
	e.waitRedrive(rd.ID, 2*time.Minute)
	if n := c.get(fmt.Sprint("deferred in epoch ", rd.Epoch)); n != 1 {
		t.Fatalf("the handler deferred d %d times in the re-drive's epoch %d, want 1", n, rd.Epoch)
	}
	if n := e.count(`SELECT count(*) FROM idem_deferred`); n != 2 {
		t.Errorf("%d deferred rows after the re-drive, want 2 (one per epoch)", n)
	}
}

// A throttled KeyFunc (found reading the round's diff): a 429 or a limit of
// one dependency met while deriving a message's key (a schema registry
// asking to wait) makes that message's partition wait for it, as a
// handler's throttled message does; it does not close the gate and pause
// every partition of the member as an open breaker does. y, on the other
// partition, is handled while x waits, and the member never logs that its
// consumption paused.
func TestCrossingThrottledKeyFuncDoesNotPauseTheMember(t *testing.T) {
	t.Parallel()
	const retryAfter = 5 * time.Second
	e := newEnv(t, 2)
	var throttled atomic.Bool
	var logs logBuffer
	cfg := e.config()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cfg.KeyFunc = func(m *handler.Message) (string, error) {
		k, err := consumer.HeaderKey("idempotency-key")(m)
		if k == "x" && throttled.CompareAndSwap(false, true) {
			return "", &breaker.ThrottleError{Name: "registry", Reason: breaker.ReasonRetryAfter, RetryAfter: retryAfter}
		}
		return k, err
	}
	p := e.k.Producer(t)
	e.send(p, 0, []byte("x"), "x")
	r := start(t, cfg, effectHandler())
	testenv.Eventually(t, 60*time.Second, func() error {
		if !throttled.Load() {
			return errors.New("x's key has not met the 429 yet")
		}
		return nil
	})
	e.send(p, 1, []byte("y"), "y")
	e.coreWaitEffects(2, 60*time.Second)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); strings.Contains(out, "consumption paused") {
		t.Errorf("x's throttled key paused the member's consumption:\n%s", out)
	}
}

package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// dependency is a fake downstream service that can be taken down.
type dependency struct {
	down  atomic.Bool
	calls atomic.Int64
}

var errDown = errors.New("bank-api: 503")

func (d *dependency) call(context.Context) error {
	d.calls.Add(1)
	if d.down.Load() {
		return errDown
	}
	return nil
}

// breakerEnv wires a breaker set whose transitions are recorded and exported.
type breakerEnv struct {
	*env
	set *breaker.Set
	dep *dependency

	mu          sync.Mutex
	transitions []string
	maxAttempt  atomic.Int64
	halfOpen    atomic.Int64 // calls that reached the dependency while the breaker was half-open

	// onProbe, if set, runs inside each call that reached the dependency
	// while the breaker was half-open (a probe), before the dependency
	// answers.
	onProbe func(ctx context.Context)
}

func newBreakerEnv(t *testing.T, partitions int32) *breakerEnv {
	t.Helper()
	b := &breakerEnv{env: newEnv(t, partitions), dep: &dependency{}}
	hook, err := consumer.BreakerMetrics(b.reg)
	if err != nil {
		t.Fatal(err)
	}
	b.set, err = breaker.NewSet(breaker.Settings{
		ConsecutiveFailures: 3,
		OpenTimeout:         300 * time.Millisecond,
		OnStateChange: func(name string, from, to breaker.State) {
			hook(name, from, to)
			b.mu.Lock()
			b.transitions = append(b.transitions, fmt.Sprintf("%s->%s", from, to))
			b.mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *breakerEnv) config() consumer.Config {
	cfg := b.env.config()
	cfg.Retry.Attempts = 4
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second}}
	return cfg
}

// handler calls the dependency through the breaker, then writes the effect.
func (b *breakerEnv) handler() handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		for {
			cur := b.maxAttempt.Load()
			if int64(m.Attempt) <= cur || b.maxAttempt.CompareAndSwap(cur, int64(m.Attempt)) {
				break
			}
		}
		if err := b.set.Do(ctx, "bank-api", b.call); err != nil {
			return err
		}
		return effectHandler()(ctx, m)
	}
}

// call is the dependency's call as the breaker runs it. It counts, in
// halfOpen, the calls that reach the dependency while the breaker is
// half-open: the probes. It counts inside the call, not where the handler
// starts: a handler that starts while the breaker is half-open may still be
// refused by it (an attempt that passed the gate before the breaker opened
// meets the probe's taken slot: TestBreakerAttemptInFlightMeetsTheProbe),
// and a refused call is no call to the dependency. While an admitted probe
// runs, the breaker stays half-open (only the probe's outcome moves it).
func (b *breakerEnv) call(ctx context.Context) error {
	if b.set.States()["bank-api"] == breaker.HalfOpen {
		b.halfOpen.Add(1)
		if b.onProbe != nil {
			b.onProbe(ctx)
		}
	}
	return b.dep.call(ctx)
}

func (b *breakerEnv) opens() int { return b.transitionsTo("closed->open", "half-open->open") }

// halfOpens returns how many times the breaker went half-open.
func (b *breakerEnv) halfOpens() int64 { return int64(b.transitionsTo("open->half-open")) }

// transitionsTo returns how many of the recorded transitions are one of trs.
func (b *breakerEnv) transitionsTo(trs ...string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, tr := range b.transitions {
		if slices.Contains(trs, tr) {
			n++
		}
	}
	return n
}

// Issue 5, tests 1 and 2: a dependency down for a while → the consumer pauses:
// nothing reaches a retry tier or the DLQ, no attempt beyond the breaker's
// threshold is spent, only the probe runs while half-open, a failed probe
// reopens; after recovery every message has exactly one effect.
func TestBreakerPausesInsteadOfRetrying(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		b := newBreakerEnv(t, 3)
		b.in(mode)
		b.dep.down.Store(true)
		keys, uniq := keysWithDuplicates(300, 0.1, 7)
		b.produce(keys, 3)
		start(t, b.config(), b.handler())

		// Let the breaker open, probe and reopen a few times while down.
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := b.opens(); n < 4 {
				return fmt.Errorf("breaker opened %d times", n)
			}
			return nil
		})
		// Every claimed partition (3 source + 3 of tier 1) is paused during
		// a cool-down (fetching resumes between one and the next, for the
		// half-open probe: TestGateResumesFetchingForTheProbe).
		testenv.Eventually(t, 60*time.Second, func() error {
			if v, claimed := metricValue(t, b.env, "idem_partitions_paused", nil), metricValue(t, b.env, "idem_partitions_assigned", nil); v != 6 || claimed != 6 {
				return fmt.Errorf("idem_partitions_paused = %v of %v claimed while open, want 6 of 6", v, claimed)
			}
			return nil
		})
		callsWhileDown := b.dep.calls.Load()
		b.dep.down.Store(false)

		b.waitCommitted(b.topic, 3, 90*time.Second)
		if n := b.count(`SELECT count(*) FROM effects`); n != uniq {
			t.Fatalf("effects = %d, want %d", n, uniq)
		}
		if n := b.total(b.dlq(), 3) + b.total(b.tier(1), 3); n != 0 {
			t.Fatalf("%d records reached a retry tier or the DLQ, want 0", n)
		}
		if a := b.maxAttempt.Load(); a > 3 {
			t.Errorf("a message reached attempt %d: the open breaker spent retries", a)
		}
		// While down, the dependency saw the 3 tripping failures plus one probe per
		// reopen, not one call per message.
		opens := int64(b.opens())
		if callsWhileDown > 3+opens+3 { // +3: partitions racing the first trip
			t.Errorf("dependency called %d times while down for %d opens: not paused", callsWhileDown, opens)
		}
		b.mu.Lock()
		trs := append([]string(nil), b.transitions...)
		b.mu.Unlock()
		for i, tr := range trs {
			if tr == "half-open->open" && (i == 0 || trs[i-1] != "open->half-open") {
				t.Errorf("transitions out of order: %v", trs)
			}
		}
		if trs[len(trs)-1] != "half-open->closed" {
			t.Errorf("breaker did not close at the end: %v", trs)
		}
		// Only the probe ran while half-open: each half-open period ended
		// with its probe's outcome, and no other call reached the dependency.
		if got, halfOpens := b.halfOpen.Load(), b.halfOpens(); got != halfOpens {
			t.Errorf("%d calls reached the dependency while half-open, over %d half-open periods: want one probe each", got, halfOpens)
		}
		if v := metricValue(t, b.env, "idem_breaker_state", map[string]string{"name": "bank-api"}); v != 0 {
			t.Errorf("idem_breaker_state = %v, want 0 (closed)", v)
		}
		if v := metricValue(t, b.env, "idem_breaker_transitions_total", map[string]string{"name": "bank-api", "to": "open"}); v < 4 {
			t.Errorf("transitions to open = %v", v)
		}
		if v := metricValue(t, b.env, "idem_partitions_paused", nil); v != 0 {
			t.Errorf("idem_partitions_paused = %v after recovery, want 0", v)
		}
	})
}

// An attempt that passed the gate before the breaker opened (a lane waiting
// for a pool connection, a batch inserting its inbox rows, on a loaded
// machine) may reach its handler after the cool-down, while the gate's probe
// runs: a handler call then starts while the breaker is half-open, but the
// breaker refuses it (the probe holds the one slot), so only the probe
// reaches the dependency. TestBreakerPausesInsteadOfRetrying/batch once
// failed on this interleaving (a clean-clone CI run, 2 cores: "5 handler
// calls began while half-open, over 4 half-open periods"): it counted the
// handlers that read the state half-open as they started, not the calls the
// breaker let through. Here it is forced: S's handler starts before the
// breaker opens and calls the dependency once the probe is inside its call.
func TestBreakerAttemptInFlightMeetsTheProbe(t *testing.T) {
	t.Parallel()
	forEachMode(t, allModes, func(t *testing.T, mode testMode) {
		b := newBreakerEnv(t, 2)
		b.in(mode)
		b.dep.down.Store(true)
		sIn := make(chan struct{})     // S's handler started, the breaker closed
		probeIn := make(chan struct{}) // a probe is inside its call
		sDone := make(chan struct{})   // the breaker answered S
		var sState breaker.State
		var sErr error
		var sFirst atomic.Bool
		var probeOnce sync.Once
		b.onProbe = func(ctx context.Context) {
			probeOnce.Do(func() {
				close(probeIn)
				select { // hold the slot until the breaker has answered S
				case <-sDone:
				case <-ctx.Done():
				}
			})
		}
		h := b.handler()
		start(t, b.config(), handler.Func(func(ctx context.Context, m *handler.Message) error {
			if m.IdempotencyKey != "S" || !sFirst.CompareAndSwap(false, true) {
				return h(ctx, m)
			}
			close(sIn)
			select {
			case <-probeIn:
			case <-ctx.Done():
				return ctx.Err()
			}
			sState = b.set.States()["bank-api"]
			sErr = b.set.Do(ctx, "bank-api", b.call)
			close(sDone)
			return sErr
		}))
		p := b.k.Producer(t)
		send := func(partition int32, key string) {
			t.Helper()
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: b.topic, Partition: partition, Value: sarama.StringEncoder(key),
				Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}}); err != nil {
				t.Fatal(err)
			}
		}
		wait := func(ch <-chan struct{}, what string) {
			t.Helper()
			select {
			case <-ch:
			case <-time.After(60 * time.Second):
				t.Fatalf("timed out waiting for %s", what)
			}
		}
		send(1, "S")
		wait(sIn, "S's handler") // S is past the gate, which is open
		// k1..k3 open the breaker; after the cool-down one of them is the probe.
		for _, k := range []string{"k1", "k2", "k3"} {
			send(0, k)
		}
		wait(sDone, "the breaker's answer to S")
		testenv.Eventually(t, 60*time.Second, func() error {
			if n := b.opens(); n < 2 { // the probe that held the slot failed
				return fmt.Errorf("breaker opened %d times", n)
			}
			return nil
		})
		b.dep.down.Store(false)
		b.waitCommitted(b.topic, 2, 90*time.Second)

		var oe *breaker.OpenError
		if sState != breaker.HalfOpen || !errors.As(sErr, &oe) || oe.State != breaker.HalfOpen {
			t.Errorf("S read %v and the breaker answered %v; want half-open, refused while half-open", sState, sErr)
		}
		if got, halfOpens := b.halfOpen.Load(), b.halfOpens(); got != halfOpens {
			t.Errorf("%d calls reached the dependency while half-open, over %d half-open periods: want one probe each", got, halfOpens)
		}
		if n := b.count(`SELECT count(*) FROM effects`); n != 4 {
			t.Errorf("effects = %d, want 4", n)
		}
		if n := b.total(b.dlq(), 2) + b.total(b.tier(1), 2); n != 0 {
			t.Errorf("%d records reached a retry tier or the DLQ, want 0", n)
		}
	})
}

// Issue 5, test 3: a rebalance while paused: a second member joins while the
// breaker is open; the new owner honours the open breaker too, and nothing is
// lost or doubled once the dependency recovers.
func TestBreakerRebalanceWhilePaused(t *testing.T) {
	t.Parallel()
	b := newBreakerEnv(t, 4)
	b.dep.down.Store(true)
	keys, uniq := keysWithDuplicates(200, 0, 3)
	b.produce(keys, 4)
	first := start(t, b.config(), b.handler())
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := b.opens(); n < 2 {
			return fmt.Errorf("breaker opened %d times", n)
		}
		return nil
	})
	second := start(t, b.config(), b.handler())
	// Wait for the rebalance to hand partitions to the second member.
	testenv.Eventually(t, 60*time.Second, func() error {
		d, err := b.k.Admin(t).DescribeConsumerGroups([]string{b.group})
		if err != nil {
			return err
		}
		if len(d) != 1 || len(d[0].Members) != 2 {
			return fmt.Errorf("group members: %d", len(d[0].Members))
		}
		return nil
	})
	opensBefore := b.opens()
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := b.opens(); n < opensBefore+2 {
			return fmt.Errorf("breaker opened %d times", n)
		}
		return nil
	})
	b.dep.down.Store(false)
	b.waitCommitted(b.topic, 4, 90*time.Second)
	if n := b.count(`SELECT count(*) FROM effects`); n != uniq {
		t.Fatalf("effects = %d, want %d", n, uniq)
	}
	if n := b.total(b.dlq(), 4) + b.total(b.tier(1), 4); n != 0 {
		t.Fatalf("%d records reached a retry tier or the DLQ, want 0", n)
	}
	if err := second.stop(); err != nil {
		t.Fatal(err)
	}
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestBreakerStateSeriesFromTheStart: a breaker that never changed state
// still has an idem_breaker_state series, of 0 (closed), and no transition is
// counted for it, so a healthy service's breaker panel is not empty.
func TestBreakerStateSeriesFromTheStart(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	hook, err := consumer.BreakerMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	set, err := breaker.NewSet(breaker.Settings{OnStateChange: hook})
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Do(context.Background(), "bank-api", func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series int
	for _, mf := range mfs {
		switch mf.GetName() {
		case "idem_breaker_state":
			for _, m := range mf.GetMetric() {
				series++
				if l := m.GetLabel(); len(l) != 1 || l[0].GetValue() != "bank-api" || m.GetGauge().GetValue() != 0 {
					t.Errorf("idem_breaker_state series %v = %v, want {name=bank-api} = 0", l, m.GetGauge().GetValue())
				}
			}
		case "idem_breaker_transitions_total":
			t.Errorf("idem_breaker_transitions_total has %d series for a breaker that never changed state", len(mf.GetMetric()))
		}
	}
	if series != 1 {
		t.Fatalf("idem_breaker_state has %d series, want 1 (bank-api, closed)", series)
	}
}

// TestThrottleCountedAndLoggedAsThrottle: a handler refused by a limit
// (*breaker.ThrottleError) pauses the partition like an open breaker, but
// its attempt counts as result "throttled", not "breaker_open", and the
// pause's log names the dependency and the reason.
func TestThrottleCountedAndLoggedAsThrottle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	var logs logBuffer
	cfg := e.config()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var calls atomic.Int64
	start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
		if calls.Add(1) == 1 {
			return &breaker.ThrottleError{Name: "bank-api", Reason: breaker.ReasonRate, RetryAfter: 50 * time.Millisecond}
		}
		return effectHandler()(ctx, m)
	}))
	e.produce([]string{"k1"}, 1)
	e.waitEffect("k1", 60*time.Second)
	if v := metricValue(t, e, "idem_handler_attempts_total", map[string]string{"result": coremetrics.ResultThrottled}); v != 1 {
		t.Errorf("throttled attempts = %v, want 1", v)
	}
	if v := metricValue(t, e, "idem_handler_attempts_total", map[string]string{"result": coremetrics.ResultBreakerOpen}); v != 0 {
		t.Errorf("breaker_open attempts = %v, want 0", v)
	}
	if out := logs.String(); !strings.Contains(out, "dependency throttled") || !strings.Contains(out, "breaker=bank-api") || !strings.Contains(out, "reason=rate") {
		t.Errorf("no pause log naming the throttled dependency; logs:\n%s", out)
	}
}

// A batch that waits on an open breaker while the deadline of one of its
// messages passes must not be handled as a batch (the hour's swarm soak,
// seed 1796369855658974471: batched records handled 14-19 s past their
// deadline, on their first attempt, once a breaker's cool-down ended):
// handleBatch sends its messages alone, and M is dead-lettered as expired,
// never handled. M's partition is held (S) until the breaker is open, so
// M's batch forms while it is. This test does not reproduce the soak's
// race: in six runs without the fix it passed (M's batch did not pass the
// gate on another message's probe); it guards the outcome, and the seed
// is the evidence for the fix.
func TestBatchExpiredWhileTheBreakerHeldIt(t *testing.T) {
	t.Parallel()
	forEachMode(t, []testMode{"batch", "lanes-batch"}, func(t *testing.T, mode testMode) {
		b := newBreakerEnv(t, 5)
		b.in(mode)
		opened := make(chan struct{})
		var once sync.Once
		var err error
		b.set, err = breaker.NewSet(breaker.Settings{
			ConsecutiveFailures: 3,
			OpenTimeout:         2 * time.Second,
			OnStateChange: func(name string, from, to breaker.State) {
				if to == breaker.Open {
					once.Do(func() { close(opened) })
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		cfg := mode.apply(b.config())
		b.dep.down.Store(true)
		var late atomic.Int32
		var deadline atomic.Int64
		h := b.handler()
		start(t, cfg, handler.Func(func(ctx context.Context, m *handler.Message) error {
			switch {
			case m.IdempotencyKey == "S": // holds partition 1 until the breaker is open
				select {
				case <-opened:
				case <-ctx.Done():
					return ctx.Err()
				}
				return nil
			case m.IdempotencyKey == "M" && time.Now().UnixMilli() > deadline.Load():
				late.Add(1)
			}
			return h(ctx, m)
		}))
		p := b.k.Producer(t)
		send := func(partition int32, ikey, dl string) {
			t.Helper()
			hs := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(ikey)}}
			if dl != "" {
				hs = append(hs, sarama.RecordHeader{Key: []byte("idem-deadline"), Value: []byte(dl)})
			}
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: b.topic, Partition: partition, Value: sarama.StringEncoder(ikey), Headers: hs}); err != nil {
				t.Fatal(err)
			}
		}
		d := time.Now().Add(1500 * time.Millisecond)
		deadline.Store(d.UnixMilli())
		send(1, "S", "")
		send(1, "M", strconv.FormatInt(d.UnixMilli(), 10))
		for _, part := range []int32{0, 2, 3, 4} { // they trip the breaker, then wait at the gate
			send(part, fmt.Sprintf("w%d", part), "")
		}
		// The dependency stays down until the breaker is open and M's
		// deadline has passed, and is up before the cool-down ends. (Up on
		// a timer alone, it could come back before a loaded machine's
		// consumer had tripped the breaker: S then waited for ever.)
		select {
		case <-opened:
		case <-t.Context().Done():
			return
		}
		select {
		case <-time.After(time.Until(d) + 200*time.Millisecond):
		case <-t.Context().Done():
			return
		}
		b.dep.down.Store(false)
		b.waitCommitted(b.topic, 5, 90*time.Second)
		if n := late.Load(); n != 0 {
			t.Errorf("M was handled %d times past its deadline", n)
		}
		kinds := map[string]string{}
		for _, r := range b.records(b.dlq(), sarama.ReadCommitted) {
			kinds[header(r, "idempotency-key")] = header(r, wire.HeaderErrorKind)
		}
		if kinds["M"] != "expired" {
			t.Errorf("DLQ kinds %v: want M with kind expired", kinds)
		}
	})
}

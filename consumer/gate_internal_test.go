package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testkit"
)

// pauseGroup is a sarama.ConsumerGroup that only keeps the pause state of
// each partition, as sarama's consumer does.
type pauseGroup struct {
	sarama.ConsumerGroup
	mu     sync.Mutex
	paused map[tp]bool
}

func (g *pauseGroup) set(m map[string][]int32, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for topic, ps := range m {
		for _, p := range ps {
			g.paused[tp{topic, p}] = on
		}
	}
}

func (g *pauseGroup) Pause(m map[string][]int32)  { g.set(m, true) }
func (g *pauseGroup) Resume(m map[string][]int32) { g.set(m, false) }

func (g *pauseGroup) isPaused(k tp) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.paused[k]
}

// newTestGate is a gate over a runner that only pauses partitions, in the
// returned group.
func newTestGate() (*pauseGroup, *gate) {
	group := &pauseGroup{paused: map[tp]bool{}}
	r := &runner{log: slog.New(slog.DiscardHandler)}
	r.pauses = newPauser(group, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "paused"}, []string{"reason"}))
	r.gate = newGate(r)
	return group, r.gate
}

// A claim that joins while a breaker holds the gate closed (the session
// before it ended: a rebalance, a failed Kafka transaction) has nothing
// buffered: its fetching, paused at join, must resume when the cool-down
// ends, or no message ever comes to be the half-open probe and the member
// stalls with the gate closed for good (swarm seed 5111: a member's
// transaction failed 0.3 s after its breaker opened, and its partitions
// stayed paused until the run gave up). The workers still wait at the gate
// until one message's probe passes; a failed probe pauses fetching again.
func TestGateResumesFetchingForTheProbe(t *testing.T) {
	group, g := newTestGate()
	k := tp{"orders", 0}
	open := func() error {
		return &breaker.OpenError{Name: "bank", State: breaker.Open, RetryAfter: 20 * time.Millisecond}
	}
	fetching := func() error {
		if group.isPaused(k) {
			return fmt.Errorf("%v still paused", k)
		}
		return nil
	}

	g.join(k)
	g.trip(open())
	if !group.isPaused(k) {
		t.Fatal("the breaker opened and the partition is not paused")
	}
	// The session ends, its buffered messages with it, and the next one
	// claims the partition again while the gate is closed.
	g.leave(k)
	g.r.pauses.forget(k)
	g.join(k)
	if !group.isPaused(k) {
		t.Fatal("a claim joined a closed gate during its cool-down and is not paused")
	}
	testkit.Eventually(t, 10*time.Second, fetching)

	// The gate stays closed for workers: one message goes through as the
	// probe; it meets the open breaker again, and fetching pauses again.
	if _, _, _, closed := g.open(); !closed {
		t.Fatal("the gate opened without a probe")
	}
	probe, ok := g.wait(t.Context())
	if !probe || !ok {
		t.Fatalf("wait = probe %v, ok %v; want the probe", probe, ok)
	}
	g.trip(open())
	g.probeDone(true)
	if !group.isPaused(k) {
		t.Fatal("a probe failed and the partition is not paused again")
	}

	// The next cool-down ends: fetching resumes, a probe passes, the gate
	// opens.
	testkit.Eventually(t, 10*time.Second, fetching)
	if probe, ok := g.wait(t.Context()); !probe || !ok {
		t.Fatalf("wait = probe %v, ok %v; want the probe", probe, ok)
	}
	g.probeDone(false)
	if _, _, _, closed := g.open(); closed {
		t.Fatal("a probe passed and the gate is still closed")
	}
	if group.isPaused(k) {
		t.Fatal("the gate opened and the partition is still paused")
	}
	g.close()
}

// A nil *prometheus.Registry as Config.Registerer means no metrics, as nil
// does: Run's set-up (the metrics, the limits' collector) does not panic on
// it.
func TestNilRegistryPointerIsNoMetrics(t *testing.T) {
	var registry *prometheus.Registry
	set, err := breaker.NewSet(breaker.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	h := handler.Func(func(context.Context, *handler.Message) error { return nil })
	cfg := Config{Brokers: []string{"127.0.0.1:9"}, Group: "g", Topics: []string{"t"}, Dedupe: dedupe.NewMemory(),
		Logger: slog.New(slog.DiscardHandler), Registerer: registry, Limits: LimitsConfig{Breakers: set}}.withDefaults()
	if cfg.Registerer != nil {
		t.Fatalf("withDefaults kept Registerer %#v, want nil", cfg.Registerer)
	}
	if err := registerLimits(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := newRunner(cfg, h); err != nil {
		t.Fatal(err)
	}
}

// A breaker's OpenError reported by another worker while the half-open
// probe is running (an attempt that started before the gate closed, on
// another lane or partition) extends the cool-down but does not end the
// probe: the probe still holds its slot, so no second worker goes through
// as a probe at the next cool-down's end while the first still runs, and
// the probe's own outcome decides (probeDone). trip used to clear the
// probing flag on every trip.
func TestGateTripKeepsARunningProbe(t *testing.T) {
	_, g := newTestGate()
	t.Cleanup(g.close)
	open := func() error {
		return &breaker.OpenError{Name: "bank", State: breaker.Open, RetryAfter: 10 * time.Millisecond}
	}
	g.join(tp{"orders", 0})
	g.trip(open())
	probe, ok := g.wait(t.Context()) // returns once the cool-down ends
	if !ok || !probe {
		t.Fatalf("wait after the cool-down = probe %v, ok %v; want the probe", probe, ok)
	}
	g.trip(open()) // another worker's attempt meets the open breaker
	g.mu.Lock()
	probing := g.probing
	g.mu.Unlock()
	if !probing {
		t.Fatal("a trip from another worker ended the running probe: a second probe could start beside it")
	}
	g.probeDone(false) // the probe passed: the gate opens for all
	if _, _, _, closed := g.open(); closed {
		t.Fatal("the probe passed and the gate is still closed")
	}
	if probe, ok := g.wait(t.Context()); !ok || probe {
		t.Fatalf("wait on an open gate = probe %v, ok %v; want through, no probe", probe, ok)
	}
}

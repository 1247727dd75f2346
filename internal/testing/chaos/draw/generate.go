package draw

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// This file is Generate: the three random streams a Spec's seed drives
// (the features and their parameters, the workload's shape, the faults),
// the implications and conflicts between features, and the correlated
// placement of faults in a feature's windows.

// probability of a feature, and of a fault kind, being on when neither
// forced nor dropped: swarm testing leaves about half the features out.
const (
	pFeature = 0.5
	pFault   = 0.3
)

// Generate draws spec's configuration, workload and faults. Unknown names in
// Force and Drop are an error.
func Generate(spec Spec) (*Draw, error) {
	if spec.Nodes == 0 {
		spec.Nodes = 1
	}
	if spec.Nodes != 1 && spec.Nodes != 3 {
		return nil, fmt.Errorf("draw: Nodes %d: want 1 or 3", spec.Nodes)
	}
	kinds := FaultKinds(spec.Nodes)
	for _, n := range append(slices.Clone(spec.Force), spec.Drop...) {
		base, _, _ := strings.Cut(n, "#")
		if !slices.Contains(Features, Feature(base)) && !slices.Contains(kinds, base) {
			return nil, fmt.Errorf("draw: %q is neither a feature nor a fault kind (features: %v; faults: %v)", n, Features, kinds)
		}
	}
	force := func(n string) bool { return slices.Contains(spec.Force, n) }
	drop := func(n string) bool { return slices.Contains(spec.Drop, n) }
	d := &Draw{Spec: spec}

	// Stream 1: the features and every feature's parameters, drawn whether
	// it is on or not, so that forcing or dropping one changes nothing else.
	r := rand.New(rand.NewPCG(spec.Seed, 1))
	on := map[Feature]bool{}
	for _, f := range Features {
		on[f] = r.Float64() < pFeature || force(string(f))
	}
	// Fault kinds force the features they need.
	for _, k := range kinds {
		if force(k) {
			for _, f := range needs[k] {
				on[f] = true
			}
		}
	}
	produceFor := 40 * time.Second
	if spec.CI {
		produceFor = 25 * time.Second
	}
	c := &d.Config
	c.Partitions = 3 + r.IntN(4)
	members := 2 + r.IntN(3)
	batch := 2 + r.IntN(63)
	conc := []int{4, 16}[r.IntN(2)]
	adaptive := 4 + r.IntN(9)
	txnTimeout := []time.Duration{3 * time.Second, 10 * time.Second}[r.IntN(2)]
	tiers := drawDelays(r, 1+r.IntN(3), []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second})
	c.Attempts = 2 + r.IntN(2)
	ladder := &LadderRule{Attempts: 2 + r.IntN(2), Delays: drawDelays(r, 1+r.IntN(2), []time.Duration{time.Second, 2 * time.Second, 4 * time.Second})}
	maxAge := time.Duration(30+r.IntN(46)) * time.Second
	hookFail := drawWindows(r, produceFor, 2*time.Second, 6*time.Second)
	brk := &BreakerSpec{Rate: float64(100 + r.IntN(301)), Burst: 10 + r.IntN(41), MaxInFlight: 4 + r.IntN(13),
		Down: drawWindows(r, produceFor, 2*time.Second, 4*time.Second)}
	throttle := drawWindows(r, produceFor, time.Second, 4*time.Second)
	retryAfter := time.Duration(1+r.IntN(2)) * time.Second
	coinOrdering := r.IntN(2) == 0
	fraudTiers := r.IntN(2) == 0
	tierRefuses := r.IntN(3) == 0
	// Stream 1 ends here: what follows only reads the switches.

	// Implications and the one conflict the library refuses (Validate: a
	// rule with a ladder of its own is not supported with Ordering ByKey).
	if on[OutboxEO] {
		on[Outbox] = true
	}
	if on[HookFail] && !on[HookDLQ] && !on[HookExpired] {
		on[HookDLQ] = true
	}
	if on[HookExpired] && !on[ExpiryAge] && !on[ExpiryDeadline] {
		on[ExpiryDeadline] = true
	}
	if on[Ordering] && on[RuleLadder] {
		switch {
		case force(string(Ordering)) && !force(string(RuleLadder)):
			on[RuleLadder] = false
		case force(string(RuleLadder)) && !force(string(Ordering)):
			on[Ordering] = false
		case coinOrdering:
			on[RuleLadder] = false
		default:
			on[Ordering] = false
		}
	}
	for _, f := range Features {
		if drop(string(f)) {
			on[f] = false
		}
	}
	// What depends on a dropped feature goes with it.
	if !on[Outbox] {
		on[OutboxEO] = false
	}
	if !on[HookDLQ] && !on[HookExpired] {
		on[HookFail] = false
	}
	for _, f := range Features {
		if on[f] {
			d.Features = append(d.Features, f)
		}
	}

	c.Members = when(on[Members], members, 1)
	c.BatchSize = when(on[Batch], batch, 0)
	c.BatchHandler = on[BatchHandler]
	c.Concurrency = when(on[Lanes], conc, 1)
	c.AdaptiveMax = when(on[Adaptive], adaptive, 0)
	c.Ordering = on[Ordering]
	c.Transactions = on[Transactions]
	c.TxnTimeout = when(on[Transactions], Duration(txnTimeout), 0)
	c.InstanceIDs = on[InstanceID]
	c.Tiers = when(on[Tiers], tiers, nil)
	c.RuleLadder = when(on[RuleLadder], ladder, nil)
	c.RuleDLQ = on[RuleDLQ]
	c.RuleDLQTiers = on[RuleDLQ] && on[Tiers] && fraudTiers
	c.Tier1MaxBytes = when(on[Tiers] && tierRefuses, 64<<10, 0)
	c.MaxAge = when(on[ExpiryAge], Duration(maxAge), 0)
	c.Defer = on[Defer]
	c.HookDLQ, c.HookExpired = on[HookDLQ], on[HookExpired]
	c.HookFail = when(on[HookFail], hookFail, nil)
	c.Breaker = when(on[Breaker], brk, nil)
	c.BreakerOpen = when(on[Breaker], Duration(5*time.Second), 0) // longer than a down window: one failure per call at most
	c.Throttle = when(on[Throttle], throttle, nil)
	c.RetryAfter = when(on[Throttle], Duration(retryAfter), 0)
	c.Outbox, c.OutboxEO = on[Outbox], on[OutboxEO]
	c.Backoff = Duration(500 * time.Millisecond)
	c.SessionTimer = Duration(10 * time.Second)

	// Stream 2: the workload's shape.
	w := rand.New(rand.NewPCG(spec.Seed, 2))
	d.Workload = Workload{ProduceFor: Duration(produceFor), DupRate: 0.05 + 0.15*w.Float64(), Keys: 10 + w.IntN(191)}
	d.Workload.Records = 1500 + w.IntN(1501)
	d.Workload.PoisonEach = 2 + w.IntN(3)
	if spec.CI {
		d.Workload.Records = 800 + w.IntN(701)
		d.Workload.PoisonEach = 1 + w.IntN(2)
	}
	for _, k := range PoisonOrder {
		if w.Float64() < 0.6 {
			d.Workload.Poison = append(d.Workload.Poison, k)
		}
	}
	if len(d.Workload.Poison) < 3 { // always a few kinds: a partition full of poison is part of every run
		d.Workload.Poison = append(d.Workload.Poison[:0], "empty-key", "truncated", "bad-deadline")
	}
	if slices.Contains(d.Workload.Poison, "oversized") {
		c.DLQMaxBytes = 128 << 10
	}

	// Stream 3: the faults, each kind drawn with its time and target whether
	// it happens or not.
	fr := rand.New(rand.NewPCG(spec.Seed, 3))
	for _, k := range kinds {
		n := 1
		if k == FaultKill {
			n = 1 + fr.IntN(3)
		}
		happens := fr.Float64() < pFault
		var fs []Fault
		for i := range n {
			id := k
			if i > 0 {
				id = fmt.Sprintf("%s#%d", k, i+1)
			}
			at := math.Round((0.08+0.8*fr.Float64())*1000) / 1000
			if k == FaultJoin {
				at = math.Round((1+3*fr.Float64())*10) / 10 // seconds into the drain
			}
			fs = append(fs, Fault{ID: id, Kind: k, At: at, Slot: fr.IntN(64)})
		}
		if !(happens || force(k)) || drop(k) {
			continue
		}
		if !slices.ContainsFunc(needs[k], func(f Feature) bool { return !on[f] }) {
			for _, f := range fs {
				if !drop(f.ID) {
					d.Faults = append(d.Faults, f)
				}
			}
		}
	}
	// Correlated placements: a crossing that needs a fault inside a window
	// of a feature is drawn there (issue 28, defect 1: a graceful stop
	// while OnDeadLettered fails, with Transactions), not left to chance.
	if on[Transactions] && len(c.HookFail) > 0 {
		if i := slices.IndexFunc(d.Faults, func(f Fault) bool { return f.Kind == FaultTerm }); i >= 0 {
			w := c.HookFail[0]
			at := w.From + (w.To-w.From)/2
			d.Faults[i].AtT0 = at
			d.Faults[i].At = math.Round(float64(at)/float64(produceFor)*1000) / 1000
		}
	}
	slices.SortStableFunc(d.Faults, func(a, b Fault) int {
		ta, tb := a.At, b.At
		if a.Kind == FaultJoin {
			ta += 10
		}
		if b.Kind == FaultJoin {
			tb += 10
		}
		switch {
		case ta < tb:
			return -1
		case ta > tb:
			return 1
		}
		return 0
	})
	return d, nil
}

// when is v when on, else off.
func when[T any](on bool, v, off T) T {
	if on {
		return v
	}
	return off
}

// drawDelays draws n delays out of choices, in increasing order.
func drawDelays(r *rand.Rand, n int, choices []time.Duration) []Duration {
	out := make([]Duration, n)
	for i := range out {
		out[i] = Duration(choices[r.IntN(len(choices))])
	}
	slices.Sort(out)
	return out
}

// drawWindows draws one or two windows within [0, within), each lo…hi long.
func drawWindows(r *rand.Rand, within, lo, hi time.Duration) []Window {
	n := 1 + r.IntN(2)
	out := make([]Window, n)
	for i := range out {
		from := time.Duration(r.Int64N(int64(within - hi))).Truncate(100 * time.Millisecond)
		out[i] = Window{From: Duration(from), To: Duration(from + lo + time.Duration(r.Int64N(int64(hi-lo))).Truncate(100*time.Millisecond))}
	}
	slices.SortFunc(out, func(a, b Window) int { return int(a.From - b.From) })
	return out
}

package draw

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

func mustGenerate(t *testing.T, s Spec) *Draw {
	t.Helper()
	d, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The draw is a pure function of its spec: the same spec gives the same
// JSON, other seeds give other draws.
func TestGenerateIsDeterministic(t *testing.T) {
	seen := map[string]uint64{}
	for seed := uint64(1); seed <= 200; seed++ {
		for _, s := range []Spec{{Seed: seed}, {Seed: seed, CI: true}, {Seed: seed, Nodes: 3}} {
			a, b := mustGenerate(t, s), mustGenerate(t, s)
			if a.JSON() != b.JSON() {
				t.Fatalf("spec %+v drew twice differently:\n%s\n%s", s, a.JSON(), b.JSON())
			}
		}
		j := mustGenerate(t, Spec{Seed: seed}).JSON()
		j = j[strings.Index(j, `"features"`):] // the spec holds the seed itself
		if other, ok := seen[j]; ok {
			t.Errorf("seeds %d and %d drew the same configuration, workload and faults", other, seed)
		}
		seen[j] = seed
	}
}

// Every draw respects what the library and the harness need: the conflict
// Validate refuses, the implications, each fault's features.
func TestGenerateKeepsItsRules(t *testing.T) {
	for seed := uint64(1); seed <= 500; seed++ {
		for _, nodes := range []int{1, 3} {
			d := mustGenerate(t, Spec{Seed: seed, Nodes: nodes})
			c := d.Config
			if c.Ordering && c.RuleLadder != nil {
				t.Errorf("seed %d: ordering and a rule ladder together", seed)
			}
			if d.Has(OutboxEO) && !d.Has(Outbox) {
				t.Errorf("seed %d: exactly-once relay without the outbox", seed)
			}
			if d.Has(HookFail) && !d.Has(HookDLQ) && !d.Has(HookExpired) {
				t.Errorf("seed %d: failing hooks without a hook", seed)
			}
			for _, f := range d.Faults {
				for _, need := range Needs(f.Kind) {
					if !d.Has(need) {
						t.Errorf("seed %d: fault %s without %s", seed, f.ID, need)
					}
				}
				if !slices.Contains(FaultKinds(nodes), f.Kind) {
					t.Errorf("seed %d: fault %s on %d node(s)", seed, f.Kind, nodes)
				}
			}
			if c.Transactions && c.TxnTimeout.D() <= 1e9 {
				t.Errorf("seed %d: Transactions.Timeout %s must exceed the 1s CommitInterval", seed, c.TxnTimeout)
			}
			if (c.BatchSize > 0) != d.Has(Batch) || (c.Members > 1) != d.Has(Members) || (c.Concurrency > 1) != d.Has(Lanes) {
				t.Errorf("seed %d: configuration and features disagree: %s", seed, d.JSON())
			}
			if len(d.Workload.Poison) < 3 {
				t.Errorf("seed %d: %d poison kinds, want at least 3", seed, len(d.Workload.Poison))
			}
		}
	}
}

// Forcing turns a feature or fault on (with what it needs) and dropping
// turns it off, leaving the rest of the draw as it was.
func TestForceAndDrop(t *testing.T) {
	for seed := uint64(1); seed <= 100; seed++ {
		base := mustGenerate(t, Spec{Seed: seed})
		forced := mustGenerate(t, Spec{Seed: seed, Force: []string{string(Defer), FaultTxnCollide}})
		if !forced.Has(Defer) || !forced.Has(Transactions) || !forced.Has(InstanceID) {
			t.Fatalf("seed %d: forced defer and txn-id-collision, got %s", seed, forced.Summary())
		}
		if !slices.ContainsFunc(forced.Faults, func(f Fault) bool { return f.Kind == FaultTxnCollide }) {
			t.Fatalf("seed %d: txn-id-collision forced but not scheduled: %s", seed, forced.Summary())
		}
		if forced.Workload.Records != base.Workload.Records || forced.Config.Partitions != base.Config.Partitions {
			t.Errorf("seed %d: forcing changed the workload or the partitions", seed)
		}
		for _, f := range base.Faults { // kept, though a correlated placement may move it (TestCorrelatedPlacement)
			if !slices.ContainsFunc(forced.Faults, func(g Fault) bool { return g.ID == f.ID && g.Kind == f.Kind && g.Slot == f.Slot }) {
				t.Errorf("seed %d: forcing lost fault %+v", seed, f)
			}
		}
		var drop []string
		for _, f := range base.Features {
			drop = append(drop, string(f))
		}
		for _, f := range base.Faults {
			drop = append(drop, f.ID)
		}
		empty := mustGenerate(t, Spec{Seed: seed, Drop: drop})
		if len(empty.Features) != 0 || len(empty.Faults) != 0 {
			t.Errorf("seed %d: dropped everything, still %s", seed, empty.Summary())
		}
	}
	if len(PoisonKinds) != len(PoisonOrder) {
		t.Errorf("PoisonOrder lists %d kinds of PoisonKinds' %d", len(PoisonOrder), len(PoisonKinds))
	}
	if _, err := Generate(Spec{Seed: 1, Force: []string{"no-such-thing"}}); err == nil {
		t.Error("an unknown name was accepted")
	}
}

// Over the seeds of a run, ForceNext makes every feature and every fault
// kind appear at least once, however few seeds there are (two at least:
// ordering and a rule ladder are never drawn together).
func TestCoverageForcing(t *testing.T) {
	for _, n := range []int{2, 3, 4, 6} {
		for _, nodes := range []int{1, 3} {
			tally := NewTally(nodes)
			for i := range n {
				spec := Spec{Seed: uint64(1000*n + i), Nodes: nodes, CI: true, Force: tally.ForceNext(n - i)}
				tally.Add(mustGenerate(t, spec))
			}
			if u := tally.Uncovered(); len(u) > 0 {
				t.Errorf("%d seeds on %d node(s): never drawn: %v", n, nodes, u)
			}
		}
	}
}

// Over a soak's worth of seeds, every pair of features that the library
// accepts is drawn together.
func TestPairsOverASoak(t *testing.T) {
	tally := NewTally(1)
	for seed := uint64(1); seed <= 60; seed++ {
		tally.Add(mustGenerate(t, Spec{Seed: seed}))
	}
	if m := tally.MissingPairs(); len(m) > 0 {
		t.Errorf("60 seeds never drew together: %v", m)
	}
	// A short soak forces the pairs it misses, one a seed.
	short := NewTally(1)
	for seed := uint64(1); seed <= 30; seed++ {
		short.Add(mustGenerate(t, Spec{Seed: seed, Force: short.ForcePair()}))
	}
	if m := short.MissingPairs(); len(m) > 0 {
		t.Errorf("30 seeds forcing missing pairs never drew together: %v", m)
	}
	var buf bytes.Buffer
	tally.Fail("-seed 7", []string{"each forward once per hop (read_committed)"})
	tally.Print(&buf)
	for _, want := range []string{"60 seeds", "pairs drawn together: 252 of 252", "faults by kind: kill", "rerun: -seed 7", "  x"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("the table lacks %q:\n%s", want, buf.String())
		}
	}
}

// Shrink keeps only what the failure needs: here a run fails when the draw
// has ordering and a kill, whatever else it has.
func TestShrink(t *testing.T) {
	spec := Spec{Seed: 42, Force: []string{string(Ordering), FaultKill, string(Defer), FaultPGRestart, string(Outbox)}}
	d := mustGenerate(t, spec)
	if len(d.Features) < 4 || len(d.Faults) < 2 {
		t.Fatalf("the draw is too small to shrink: %s", d.Summary())
	}
	runs := 0
	fails := func(s Spec) (bool, error) {
		runs++
		d := mustGenerate(t, s)
		return d.Has(Ordering) && slices.ContainsFunc(d.Faults, func(f Fault) bool { return f.Kind == FaultKill }), nil
	}
	small, err := Shrink(spec, fails, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	sd := mustGenerate(t, small)
	if !slices.Equal(sd.Features, []Feature{Ordering}) || len(sd.Faults) != 1 || sd.Faults[0].Kind != FaultKill {
		t.Errorf("shrunk to %s, want ordering and one kill", sd.Summary())
	}
	if runs > len(d.Features)+len(d.Faults) {
		t.Errorf("%d runs for %d candidates", runs, len(d.Features)+len(d.Faults))
	}
	if !strings.Contains(small.Args(), "-seed 42") || !strings.Contains(small.Args(), "-drop ") {
		t.Errorf("rerun arguments %q", small.Args())
	}
}

// TestCorrelatedPlacement: with Transactions and failing hooks, a graceful
// stop is drawn inside the first failing window (issue 28, defect 1), on
// the members' clock.
func TestCorrelatedPlacement(t *testing.T) {
	placed := 0
	for seed := uint64(1); seed <= 200; seed++ {
		d := mustGenerate(t, Spec{Seed: seed, Force: []string{string(Transactions), string(HookFail), FaultTerm}})
		i := slices.IndexFunc(d.Faults, func(f Fault) bool { return f.Kind == FaultTerm })
		if i < 0 {
			t.Fatalf("seed %d: term forced but not scheduled: %s", seed, d.Summary())
		}
		f, w := d.Faults[i], d.Config.HookFail[0]
		if !w.In(f.AtT0.D()) {
			t.Errorf("seed %d: term at %s since T0, not in the hooks' failing window %s–%s", seed, f.AtT0, w.From, w.To)
		}
		placed++
	}
	if placed == 0 {
		t.Fatal("no seed placed")
	}
}

package chaos

import (
	"reflect"
	"slices"
	"testing"

	"github.com/idemhq/idem/internal/testing/chaos/check"
	"github.com/idemhq/idem/internal/testing/chaos/draw"
)

// The plan is a pure function of the draw, every record has a defined
// expectation, and the poison kinds each reach the DLQ kind they must.
func TestPlanSwarm(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		d, err := draw.Generate(draw.Spec{Seed: seed, CI: true})
		if err != nil {
			t.Fatal(err)
		}
		m := &draw.Member{Config: d.Config, Topic: "t", Group: "g"}
		a, b := planSwarm(d, m, "r"), planSwarm(d, m, "r")
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("seed %d planned twice differently", seed)
		}
		kinds := map[string]bool{}
		for i, r := range a {
			if r.Seq != int64(i) {
				t.Fatalf("seed %d: record %d has seq %d", seed, i, r.Seq)
			}
			if n := countHeader(r, "chaos-seq"); n != 1 {
				t.Fatalf("seed %d: record %d (%s) has %d chaos-seq headers", seed, i, r.Kind, n)
			}
			switch r.Expect {
			case check.ExpectEffect:
			case check.ExpectDLQ, check.ExpectEither:
				if r.DLQKind == "" && len(r.DLQKinds) == 0 {
					t.Fatalf("seed %d: record %d (%s) may be dead-lettered with no kind", seed, i, r.Kind)
				}
			default:
				t.Fatalf("seed %d: record %d (%s) expects %q", seed, i, r.Kind, r.Expect)
			}
			if want, ok := draw.PoisonKinds[r.Kind]; ok {
				kinds[r.Kind] = true
				if r.Expect != check.ExpectDLQ || r.DLQKind != want || r.KafkaKey != poisonKey {
					t.Fatalf("seed %d: poison %s: %+v", seed, r.Kind, r.Produced)
				}
			}
			if r.Kind == "fraud" && r.DLQTopic != m.FraudDLQ() {
				t.Fatalf("seed %d: a fraud expected in %q", seed, r.DLQTopic)
			}
		}
		for _, k := range d.Workload.Poison {
			if !kinds[k] {
				t.Errorf("seed %d: poison kind %s drawn but not planned", seed, k)
			}
		}
		if d.Config.MaxAge > 0 && slices.ContainsFunc(a, func(r record) bool { return r.Expect == check.ExpectEffect }) {
			t.Errorf("seed %d: with a max age every valid record may expire", seed)
		}
	}
}

func countHeader(r record, k string) int {
	n := 0
	for _, h := range r.headers {
		if string(h.Key) == k {
			n++
		}
	}
	return n
}

// TestPlanCorrelations: a draw whose first tier refuses big records plans
// some (with the fraud rule through the tiers, big fraud records too), and
// a transactional draw with a fault that fences the producer plans a burst
// of records failing at their source just before it.
func TestPlanCorrelations(t *testing.T) {
	var big, bigFraud, burst int
	for seed := uint64(1); seed <= 60; seed++ {
		d, err := draw.Generate(draw.Spec{Seed: seed, CI: true, Force: []string{"tiers", "rule-dlq", "transactions", "txn-abort"}})
		if err != nil {
			t.Fatal(err)
		}
		m := &draw.Member{Config: d.Config, Topic: "t", Group: "g"}
		for _, rec := range planSwarm(d, m, "r") {
			switch rec.Kind {
			case "big":
				big++
				if d.Config.Tier1MaxBytes == 0 || len(rec.value) <= d.Config.Tier1MaxBytes {
					t.Fatalf("seed %d: a big record of %d bytes with a first tier of %d", seed, len(rec.value), d.Config.Tier1MaxBytes)
				}
			case "big-fraud":
				bigFraud++
				if !d.Config.RuleDLQTiers || rec.DLQTopic != m.FraudDLQ() {
					t.Fatalf("seed %d: a big fraud record without the fraud rule's tiers, or bound for %q", seed, rec.DLQTopic)
				}
			case "burst":
				burst++
			}
		}
	}
	if big == 0 || bigFraud == 0 || burst == 0 {
		t.Errorf("planned %d big, %d big fraud and %d burst records over 60 seeds, want some of each", big, bigFraud, burst)
	}
}

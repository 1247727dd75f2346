package check

import (
	"bytes"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	srcTopic   = "src"
	dlqTopic   = "src.g.dlq"
	fraudTopic = "src.g.dlq.fraud"
	tierTopic  = "src.g.retry.1"
)

// goodSwarm is a small swarm run that kept every guarantee, with
// transactions, ordering, both hooks, an adaptive limit, expiry by age and
// the exactly-once relay: two applied keys (one sent twice) and a deferred
// one on Kafka key c0, a record that expired by its deadline, a fraud
// dead-lettered to its rule's DLQ, and a keyless poison record whose DLQ
// record is a stub without the original headers.
func goodSwarm() *History {
	h := &History{Swarm: true, Group: "g", Topic: srcTopic, Transactional: true, Ordering: true, HookDLQ: true, HookExpired: true,
		AdaptiveMax: 4, MaxAge: 30 * time.Second, ExpirySlack: 5 * time.Second, EventsOnce: true,
		Tiers: map[string][]DLQRecord{tierTopic: nil}}
	add := func(p Produced) *Produced {
		off := int64(len(h.Produced))
		p.Seq, p.Topic, p.Partition, p.Offset = off, srcTopic, 0, off
		p.At = t0.Add(time.Duration(off) * time.Millisecond)
		p.Timestamp = p.At
		h.Produced = append(h.Produced, p)
		return &h.Produced[len(h.Produced)-1]
	}
	call := func(p *Produced, at time.Duration, outcome string) {
		h.Attempts = append(h.Attempts, Attempt{Member: "m1#1", Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Key: p.Key, Seq: p.Seq,
			Attempt: 1, Batch: 1, Outcome: outcome, Start: p.At.Add(at), End: p.At.Add(at), InFlight: 2,
			Origin: &Origin{Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Timestamp: p.Timestamp}})
	}
	apply := func(p *Produced, at time.Duration) {
		call(p, at, "ok")
		h.Effects = append(h.Effects, Effect{ID: int64(len(h.Effects) + 1), Key: p.Key, KafkaKey: p.KafkaKey, Seq: p.Seq,
			Member: "m1#1", Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Attempt: 1, At: p.At.Add(at)})
		h.Events = append(h.Events, Event{Key: p.Key, Stored: true, Published: 1, IDs: 1, Applied: 1})
	}
	dlq := func(p *Produced, topic, kind string, stub bool) {
		d := DLQRecord{Topic: topic, Offset: int64(len(h.DLQ)), Seq: p.Seq, Headers: map[string]string{
			"idem-original-topic": p.Topic, "idem-original-partition": strconv.Itoa(int(p.Partition)),
			"idem-original-offset": strconv.FormatInt(p.Offset, 10), "idem-consumer-group": "g", "idem-error-kind": kind}}
		if stub {
			d.Seq = -1
		}
		h.DLQ = append(h.DLQ, d)
	}
	hook := func(p *Produced, name, topic string, seq int64) {
		h.Hooks = append(h.Hooks, Hook{Hook: name, Seq: seq, Key: p.Key, Topic: topic, Member: "m1#1",
			Origin: Origin{Topic: p.Topic, Partition: p.Partition, Offset: p.Offset}, At: p.At.Add(time.Second)})
	}
	deferred := add(Produced{Kind: "defer", Expect: ExpectEffect, Key: "k-def", KafkaKey: "c0", Unordered: true})
	call(deferred, 100*time.Millisecond, "deferred")
	first := add(Produced{Kind: "ok", Expect: ExpectEffect, Key: "k0", KafkaKey: "c0"})
	apply(first, 200*time.Millisecond)
	add(Produced{Kind: "dup", Expect: ExpectEffect, Key: "k0", KafkaKey: "c0"})
	second := add(Produced{Kind: "flaky", Expect: ExpectEffect, Key: "k1", KafkaKey: "c0"})
	call(second, 300*time.Millisecond, "retriable")
	h.Tiers[tierTopic] = append(h.Tiers[tierTopic], DLQRecord{Topic: tierTopic, Seq: second.Seq})
	apply(second, 2*time.Second)
	apply(deferred, 3*time.Second) // out of its key's order: it was deferred
	late := add(Produced{Kind: "deadline-tier", Expect: ExpectEither, DLQKinds: []string{"expired"}, Key: "k2", KafkaKey: "c1"})
	late.Deadline = late.At.Add(time.Second)
	call(late, 100*time.Millisecond, "retriable")
	dlq(late, dlqTopic, "expired", false)
	hook(late, "dead-lettered", dlqTopic, late.Seq)
	hook(late, "expired", "", late.Seq)
	fraud := add(Produced{Kind: "fraud", Expect: ExpectDLQ, DLQKind: "retriable", DLQTopic: fraudTopic, Key: "k3", KafkaKey: "c1"})
	call(fraud, 100*time.Millisecond, "retriable")
	dlq(fraud, fraudTopic, "retriable", false)
	hook(fraud, "dead-lettered", fraudTopic, fraud.Seq)
	poison := add(Produced{Kind: "empty-key", Expect: ExpectDLQ, DLQKind: "missing-key", KafkaKey: "k-poison"})
	dlq(poison, dlqTopic, "missing-key", true)
	hook(poison, "dead-lettered", dlqTopic, -1)
	// A copy of the fraud, skipped as the same message (with Ordering: as a
	// copy of a parked one): its twin's outcome is its own.
	add(Produced{Kind: "dup-fraud", Expect: ExpectDLQ, DLQKind: "retriable", DLQTopic: fraudTopic, Key: "k3", KafkaKey: "c1"})
	// A record that expired, and its copy sent later, which took effect
	// after a record sent between them: in order, by where the copy was
	// sent.
	gone := add(Produced{Kind: "deadline-parked", Expect: ExpectEither, DLQKinds: []string{"expired"}, Key: "k4", KafkaKey: "c2"})
	dlq(gone, dlqTopic, "expired", false)
	hook(gone, "dead-lettered", dlqTopic, gone.Seq)
	hook(gone, "expired", "", gone.Seq)
	apply(add(Produced{Kind: "ok", Expect: ExpectEffect, Key: "k5", KafkaKey: "c2"}), time.Second)
	apply(add(Produced{Kind: "dup-deadline-parked", Expect: ExpectEither, DLQKinds: []string{"expired"}, Key: "k4", KafkaKey: "c2"}), 2*time.Second)
	n := int64(len(h.Produced))
	h.Lags = []Lag{{Topic: srcTopic, Partition: 0, End: n, Committed: n}, {Topic: "ordering store (heads + parked)"}}
	h.Procs = []Proc{{Name: "m1#1"}}
	return h
}

func TestGoodSwarmPasses(t *testing.T) {
	for _, txn := range []bool{true, false} {
		h := goodSwarm()
		h.Transactional = txn
		r := Check(h)
		var b bytes.Buffer
		r.Print(&b)
		if !r.OK() {
			t.Fatalf("transactions %v: a good history failed:\n%s", txn, b.String())
		}
		for _, want := range []string{"every record ends in one final outcome", "every copy keeps its origin", "hooks once per dead-lettered or expired message",
			"handler calls in flight within the adaptive limit", "no record handled past its deadline or age", "each key's effects in produced order"} {
			if !strings.Contains(b.String(), "ok   "+want) {
				t.Errorf("transactions %v: the report lacks %q:\n%s", txn, want, b.String())
			}
		}
	}
}

// TestBadSwarmsFail breaks the good swarm history in one way each (the way
// one of issue 28's defects would break it) and checks that the invariant
// guarding it fails and names the culprit.
func TestBadSwarmsFail(t *testing.T) {
	seq := func(h *History, kind string) *Produced {
		for i := range h.Produced {
			if h.Produced[i].Kind == kind {
				return &h.Produced[i]
			}
		}
		panic(kind)
	}
	cases := []struct {
		name   string
		breaks func(h *History)
		fails  []string // the invariants that must fail, and only they
		names  string   // what a violation must mention
	}{
		{"applied and dead-lettered", func(h *History) {
			p := seq(h, "deadline-tier")
			h.Effects = append(h.Effects, Effect{ID: 50, Key: p.Key, KafkaKey: p.KafkaKey, Seq: p.Seq, At: p.At})
		}, []string{"every record ends in one final outcome"}, `TWO outcomes for seq 4 key "k2"`},
		{"a record that may expire lost", func(h *History) {
			h.DLQ = slices.DeleteFunc(h.DLQ, func(d DLQRecord) bool { return d.Seq == 4 })
			h.Hooks = slices.DeleteFunc(h.Hooks, func(k Hook) bool { return k.Seq == 4 })
		}, []string{"every record ends in one final outcome"}, `LOST seq 4 key "k2"`},
		{"tier copy lost its origin timestamp (defect 6)", func(h *History) {
			a := &h.Attempts[len(h.Attempts)-1]
			for i := range h.Attempts {
				if h.Attempts[i].Seq == 3 && h.Attempts[i].Outcome == "ok" {
					a = &h.Attempts[i]
				}
			}
			o := *a.Origin
			o.Timestamp = o.Timestamp.Add(2 * time.Second)
			a.Origin = &o
		}, []string{"every copy keeps its origin"}, "ORIGIN timestamp of seq 3"},
		{"handled past its deadline", func(h *History) {
			p := seq(h, "deadline-tier")
			h.Attempts = append(h.Attempts, Attempt{Member: "m1#1", Topic: tierTopic, Seq: p.Seq, Key: p.Key, Outcome: "retriable", Start: p.Deadline.Add(20 * time.Second)})
		}, []string{"no record handled past its deadline or age"}, "EXPIRED seq 4 (deadline-tier)"},
		{"handled past its max age", func(h *History) {
			p := seq(h, "ok")
			h.Attempts = append(h.Attempts, Attempt{Member: "m1#1", Topic: tierTopic, Seq: p.Seq, Key: p.Key, Outcome: "retriable", Start: p.At.Add(time.Minute)})
		}, []string{"no record handled past its deadline or age"}, "after its max age 30s"},
		{"dead-lettered hook ran twice", func(h *History) {
			h.Hooks = append(h.Hooks, h.Hooks[2])
		}, []string{"hooks once per dead-lettered or expired message"}, "dead-lettered hook ran 2 times for seq 5"},
		{"hook ran for a message not dead-lettered (defect 4)", func(h *History) {
			p := seq(h, "flaky")
			h.Hooks = append(h.Hooks, Hook{Hook: "dead-lettered", Seq: p.Seq, Key: p.Key, Topic: dlqTopic, Member: "m1#2"})
		}, []string{"hooks once per dead-lettered or expired message"}, "dead-lettered hook ran 1 times for seq 3, flaky src/0/3 key \"k1\", which is not dead-lettered"},
		{"expired hook missing", func(h *History) {
			h.Hooks = slices.DeleteFunc(h.Hooks, func(k Hook) bool { return k.Hook == "expired" })
		}, []string{"hooks once per dead-lettered or expired message"}, "expired hook ran 0 times for seq 4"},
		{"hook of a stub's message missing", func(h *History) {
			h.Hooks = slices.DeleteFunc(h.Hooks, func(k Hook) bool { return k.Seq == -1 })
		}, []string{"hooks once per dead-lettered or expired message"}, "dead-lettered hook ran 0 times for seq 6, empty-key"},
		{"second DLQ copy for a read_committed reader (defects 1, 7)", func(h *History) {
			h.DLQ = append(h.DLQ, h.DLQ[1])
		}, []string{"each forward once per hop (read_committed)"}, "seq 5 has 2 copies in " + fraudTopic},
		{"second tier copy for a read_committed reader (defect 1)", func(h *History) {
			h.Tiers[tierTopic] = append(h.Tiers[tierTopic], h.Tiers[tierTopic][0])
		}, []string{"each forward once per hop (read_committed)"}, "seq 3 has 2 copies in " + tierTopic},
		{"rule's message in the fallback DLQ (defect 11)", func(h *History) {
			h.DLQ[1].Topic = dlqTopic
			h.Hooks[2].Topic = dlqTopic
		}, []string{"every poison record in the DLQ with its metadata"}, "POISON seq 5 (fraud, src/0/5) not in " + fraudTopic},
		{"valid record in the DLQ (defect 5)", func(h *History) {
			p := seq(h, "flaky")
			h.DLQ = append(h.DLQ, DLQRecord{Topic: dlqTopic, Seq: p.Seq, Headers: map[string]string{"idem-error-kind": "retriable"}})
			h.Hooks = append(h.Hooks, Hook{Hook: "dead-lettered", Seq: p.Seq, Topic: dlqTopic})
			h.Effects = slices.DeleteFunc(h.Effects, func(e Effect) bool { return e.Seq == p.Seq })
		}, []string{"every unique key applied exactly once", "no valid payment in the DLQ"}, `VALID seq 3 key "k1" (flaky`},
		{"an either record dead-lettered with a kind it may not have", func(h *History) {
			h.DLQ[0].Headers["idem-error-kind"] = "retriable"
			h.Hooks = slices.DeleteFunc(h.Hooks, func(k Hook) bool { return k.Hook == "expired" && k.Seq == 4 })
		}, []string{"no valid payment in the DLQ"}, `VALID seq 4 key "k2" (deadline-tier`},
		{"batches ran past the adaptive limit (defect 8)", func(h *History) {
			h.Attempts[1].InFlight, h.Attempts[1].Batch = 9, 12
		}, []string{"handler calls in flight within the adaptive limit"}, "m1#1 ran 9 handler calls at once"},
		{"event published twice with ExactlyOnce", func(h *History) {
			h.Events[0].Published = 2
		}, []string{"every outbox event published, applied once"}, `published 2 times with ExactlyOnce`},
		{"key reordered", func(h *History) {
			for i := range h.Effects {
				switch h.Effects[i].Key {
				case "k0":
					h.Effects[i].ID = 10
				case "k1":
					h.Effects[i].ID = 9
				}
			}
		}, []string{"each key's effects in produced order"}, `REORDERED kafka key "c0": "k0"`},
		{"a key left parked (defect 2)", func(h *History) {
			h.Lags[1].End = 2
		}, []string{"no lag left"}, "ordering store (heads + parked)"},
		{"two groups with one transactional.id (defect 10)", func(h *History) {
			h.Procs = append(h.Procs, Proc{Name: "c1#3", Group: "g-i", TxnID: "idem-g-i-1"})
			h.Procs[0].Group, h.Procs[0].TxnID = "g", "idem-g-i-1"
		}, []string{"each transactional.id used by one group"}, `transactional.id "idem-g-i-1" used by group "g" (m1#1) and group "g-i" (c1#3)`},
		{"a data race", func(h *History) {
			h.Procs[0].Problems = []string{"WARNING: DATA RACE"}
		}, []string{"no process ended with an unexpected error"}, "m1#1: WARNING: DATA RACE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := goodSwarm()
			c.breaks(h)
			r := Check(h)
			var b bytes.Buffer
			r.Print(&b)
			if got := r.Failed(); !slices.Equal(got, c.fails) {
				t.Fatalf("failed invariants %q, want %q:\n%s", got, c.fails, b.String())
			}
			if !strings.Contains(b.String(), c.names) {
				t.Fatalf("the report does not name %q:\n%s", c.names, b.String())
			}
		})
	}
}

// Without transactions extra copies are counted, not violations.
func TestSwarmCopiesCountedWithoutTransactions(t *testing.T) {
	h := goodSwarm()
	h.Transactional = false
	h.DLQ = append(h.DLQ, h.DLQ[1])
	r := Check(h)
	var b bytes.Buffer
	r.Print(&b)
	if !r.OK() {
		t.Fatalf("a second copy without transactions failed the run:\n%s", b.String())
	}
	if want := fraudTopic + ": 2 copies of 1 records"; !strings.Contains(b.String(), want) {
		t.Fatalf("the report does not count %q:\n%s", want, b.String())
	}
}

// TestExpiryLatenessExcludesAFreeze: a member SIGSTOPped between its
// expiry check and the handler call starts the call late by the pause; the
// pause does not count as lateness, but only for the member it stopped, and
// only as long as it lasted.
func TestExpiryLatenessExcludesAFreeze(t *testing.T) {
	const name = "no record handled past its deadline or age"
	cases := []struct {
		what   string
		member string        // who makes the late call
		after  time.Duration // how long past the deadline
		ok     bool
	}{
		{"the frozen member, just after it woke", "m1#1", 14 * time.Second, true},
		{"another member", "m2#1", 14 * time.Second, false},
		{"the frozen member, long after it woke", "m1#1", 30 * time.Second, false},
	}
	for _, c := range cases {
		h := goodSwarm()
		var p *Produced
		for i := range h.Produced {
			if h.Produced[i].Kind == "deadline-tier" {
				p = &h.Produced[i]
			}
		}
		h.Faults = append(h.Faults, Fault{Kind: "member-freeze", Member: "m1#1", Detail: "m1#1 SIGSTOPped for 13s",
			Start: p.Deadline.Add(-500 * time.Millisecond), End: p.Deadline.Add(12500 * time.Millisecond)})
		h.Attempts = append(h.Attempts, Attempt{Member: c.member, Topic: p.Topic, Seq: p.Seq, Key: p.Key, Outcome: "retriable",
			Start: p.Deadline.Add(c.after)})
		r := Check(h)
		var b bytes.Buffer
		r.Print(&b)
		if got := strings.Contains(b.String(), "ok   "+name); got != c.ok {
			t.Errorf("%s: invariant passed %v, want %v:\n%s", c.what, got, c.ok, b.String())
		}
	}
}

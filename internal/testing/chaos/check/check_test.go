package check

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)

// goodHistory is a small run that kept every guarantee: four payments on two
// Kafka keys (one delivered twice), a rival pair, two poison records, every
// record committed.
func goodHistory(mode string) *History {
	h := &History{Mode: mode, Group: "g", Topic: "payments", Orders: map[string]string{}}
	off := int64(0)
	add := func(p Produced) *Produced {
		p.Seq, p.Topic, p.Partition, p.Offset, p.At = int64(len(h.Produced)), "payments", 0, off, t0.Add(time.Duration(off)*time.Millisecond)
		off++
		h.Produced = append(h.Produced, p)
		return &h.Produced[len(h.Produced)-1]
	}
	apply := func(p *Produced) {
		h.Effects = append(h.Effects, Effect{ID: int64(len(h.Effects) + 1), Key: p.Key, KafkaKey: p.KafkaKey, Seq: p.Seq,
			Member: "m1", Topic: p.Topic, Partition: p.Partition, Offset: p.Offset, Attempt: 1, At: p.At.Add(time.Second)})
		h.Payments = append(h.Payments, Payment{Key: p.Key, Order: p.Order})
		h.Orders[p.Order] = "paid"
		h.Attempts = append(h.Attempts, Attempt{Member: "m1", Topic: p.Topic, Offset: p.Offset, Key: p.Key, Seq: p.Seq, Attempt: 1, Batch: 1, Outcome: "ok", Start: p.At, End: p.At})
	}
	dlq := func(p *Produced, kind string) {
		h.DLQ = append(h.DLQ, DLQRecord{Partition: 0, Offset: int64(len(h.DLQ)), Seq: p.Seq, Headers: map[string]string{
			"idem-original-topic": p.Topic, "idem-original-partition": strconv.Itoa(int(p.Partition)),
			"idem-original-offset": strconv.FormatInt(p.Offset, 10), "idem-consumer-group": "g", "idem-error-kind": kind}})
	}
	for i := range 4 {
		p := add(Produced{Kind: "payment", Expect: ExpectEffect, Key: fmt.Sprintf("pay-%d", i), KafkaKey: fmt.Sprintf("c%d", i%2), Order: fmt.Sprintf("o%d", i)})
		apply(p)
	}
	add(Produced{Kind: "duplicate", Expect: ExpectEffect, Key: "pay-1", KafkaKey: "c1", Order: "o1"})
	a := add(Produced{Kind: "payment", Expect: ExpectRival, Rival: int64(len(h.Produced) + 1), Key: "pay-a", KafkaKey: "c0", Order: "o9"})
	b := add(Produced{Kind: "rival", Expect: ExpectRival, Rival: a.Seq, Key: "pay-b", KafkaKey: "c0", Order: "o9"})
	apply(a)
	dlq(b, "permanent")
	dlq(add(Produced{Kind: "empty-key", Expect: ExpectDLQ, DLQKind: "missing-key"}), "missing-key")
	dlq(add(Produced{Kind: "truncated-json", Expect: ExpectDLQ, DLQKind: "decode", Key: "bad-1", KafkaKey: "c1"}), "decode")
	h.Orders["o-unpaid"] = "pending"
	h.Lags = []Lag{{Topic: "payments", Partition: 0, End: off, Committed: off}}
	h.Procs = []Proc{{Name: "m1#1", Killed: true}, {Name: "m1#2"}}
	h.Faults = []Fault{{Kind: "kill", Detail: "m1#1", Start: t0, End: t0}}
	return h
}

func TestGoodHistoryPasses(t *testing.T) {
	for _, mode := range []string{"per-message", "ordering", "transactional"} {
		h := goodHistory(mode)
		if mode == "transactional" {
			h.Mode, h.Transactional = "per-message", true
			h.Tiers = map[string][]DLQRecord{"payments.g.retry.1": {{Seq: 2}, {Seq: 3}}}
		}
		r := Check(h)
		if !r.OK() {
			var b bytes.Buffer
			r.Print(&b)
			t.Fatalf("%s: a good history failed:\n%s", mode, b.String())
		}
	}
}

// TestBadHistoriesFail breaks the good history in one way each and checks
// that exactly the matching invariant fails, naming the culprit.
func TestBadHistoriesFail(t *testing.T) {
	cases := []struct {
		name   string
		mode   string
		breaks func(h *History)
		fails  string // the invariant that must fail
		names  string // what its violation must mention
	}{
		{"lost record", "per-message", func(h *History) {
			h.Effects = slices.DeleteFunc(h.Effects, func(e Effect) bool { return e.Key == "pay-2" })
			h.Payments = slices.DeleteFunc(h.Payments, func(p Payment) bool { return p.Key == "pay-2" })
			h.Orders["o2"] = "pending"
		}, "every unique key applied exactly once", `LOST key "pay-2"`},
		{"double effect", "per-message", func(h *History) {
			e := h.Effects[1]
			e.ID, e.Seq, e.Offset, e.Member = 99, 4, 4, "m2"
			h.Effects = append(h.Effects, e)
		}, "every unique key applied exactly once", `DOUBLE key "pay-1": 2 effects`},
		{"order paid twice", "per-message", func(h *History) {
			h.Payments = append(h.Payments, Payment{Key: "pay-b", Order: "o9"})
		}, "no order paid twice", `order "o9" paid 2 times`},
		{"reordered key", "ordering", func(h *History) {
			h.Effects[0].ID, h.Effects[2].ID = h.Effects[2].ID, h.Effects[0].ID // pay-0 and pay-2 share c0
		}, "each key's effects in produced order", `REORDERED kafka key "c0"`},
		{"later rival won with ordering", "ordering", func(h *History) {
			h.Effects[4].Key, h.Effects[4].Seq = "pay-b", 6
			h.Payments[4].Key = "pay-b"
			h.DLQ[0].Seq = 5
			h.DLQ[0].Headers["idem-original-offset"] = "5"
		}, "of two payments for one order, one wins", `the later payment "pay-b"`},
		{"poison missing from the DLQ", "per-message", func(h *History) {
			h.DLQ = slices.DeleteFunc(h.DLQ, func(d DLQRecord) bool { return d.Seq == 8 })
		}, "every poison record in the DLQ with its metadata", "POISON seq 8 (truncated-json"},
		{"poison with wrong metadata", "per-message", func(h *History) {
			h.DLQ[1].Headers["idem-original-offset"] = "3"
		}, "every poison record in the DLQ with its metadata", "POISON seq 7 (empty-key"},
		{"poison applied", "per-message", func(h *History) {
			h.Effects = append(h.Effects, Effect{ID: 50, Key: "bad-1", Seq: 8})
		}, "no effect from poison or unknown keys", `STRAY effect of key "bad-1"`},
		{"valid payment dead-lettered", "per-message", func(h *History) {
			h.DLQ = append(h.DLQ, DLQRecord{Seq: 3, Headers: map[string]string{"idem-error-kind": "retriable", "idem-error": "db down"}})
		}, "no valid payment in the DLQ", `VALID seq 3 key "pay-3"`},
		{"lag left", "per-message", func(h *History) {
			h.Lags = append(h.Lags, Lag{Topic: "payments.g.retry.1", Partition: 2, End: 7, Committed: 5})
		}, "no lag left", "payments.g.retry.1/2: committed 5, end 7: lag 2"},
		{"member panicked", "per-message", func(h *History) {
			h.Procs[1].ExitCode = 2
			h.Procs[1].Problems = []string{"panic: runtime error"}
		}, "no process ended with an unexpected error", "panic: runtime error"},
		{"event applied twice", "per-message", func(h *History) {
			h.Events = []Event{{Key: "pay-0", Stored: true, Published: 2, IDs: 1, Applied: 1}, {Key: "pay-1", Stored: true, Published: 1, IDs: 1, Applied: 2}}
		}, "every outbox event published, applied once", `the event of payment "pay-1" was applied 2 times`},
		{"event lost", "per-message", func(h *History) {
			h.Events = []Event{{Key: "pay-0", Stored: true, Published: 1, IDs: 1, Applied: 1}, {Key: "pay-1", Stored: true}}
		}, "every outbox event published, applied once", `the event of payment "pay-1" was never published`},
		{"event of a rolled-back payment", "per-message", func(h *History) {
			h.Events = []Event{{Key: "pay-b", Published: 1, IDs: 1, Applied: 1}}
		}, "every outbox event published, applied once", `payment "pay-b" is not stored`},
		{"DLQ copy doubled in a transactional run", "per-message", func(h *History) {
			h.Transactional = true
			h.DLQ = append(h.DLQ, h.DLQ[2])
		}, "each forward once per hop (read_committed)", "seq 8 has 2 copies in dlq"},
		{"tier copy doubled in a transactional run", "per-message", func(h *History) {
			h.Transactional = true
			h.Tiers = map[string][]DLQRecord{"payments.g.retry.1": {{Seq: 2}, {Seq: 3}, {Seq: 2}}}
		}, "each forward once per hop (read_committed)", "seq 2 has 2 copies in payments.g.retry.1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := goodHistory(c.mode)
			c.breaks(h)
			r := Check(h)
			var b bytes.Buffer
			r.Print(&b)
			if r.OK() {
				t.Fatalf("the checker passed a history with a %s:\n%s", c.name, b.String())
			}
			if got := r.Failed(); !slices.Equal(got, []string{c.fails}) {
				t.Fatalf("failed invariants %q, want only %q:\n%s", got, c.fails, b.String())
			}
			if !strings.Contains(b.String(), c.names) {
				t.Fatalf("the report does not name %q:\n%s", c.names, b.String())
			}
			if !strings.Contains(b.String(), "FAIL "+c.fails) {
				t.Fatalf("the report does not mark %q failed:\n%s", c.fails, b.String())
			}
		})
	}
}

// TestTimelineShowsTheStory checks that a lost record's violation carries its
// produce, each handler call and the faults around them, in time order.
func TestTimelineShowsTheStory(t *testing.T) {
	h := goodHistory("per-message")
	h.Effects = slices.DeleteFunc(h.Effects, func(e Effect) bool { return e.Key == "pay-2" })
	h.Attempts = append(h.Attempts, Attempt{Member: "m3", Topic: "payments", Offset: 2, Key: "pay-2", Seq: 2, Attempt: 2, Batch: 1,
		Outcome: "retriable", Error: "connection refused", Start: t0.Add(3 * time.Second), End: t0.Add(3 * time.Second)})
	h.Faults = append(h.Faults, Fault{Kind: "pg-restart", Start: t0.Add(2 * time.Second), End: t0.Add(4 * time.Second)})
	var b bytes.Buffer
	Check(h).Print(&b)
	out := b.String()
	want := []string{"produced seq 2 payments/0/2", "fault pg-restart", "m3 handled seq 2 read at payments/0/2 attempt 2", "connection refused"}
	last := -1
	for _, w := range want {
		i := strings.Index(out, w)
		if i < 0 || i < last {
			t.Fatalf("timeline lacks %q after the previous line:\n%s", w, out)
		}
		last = i
	}
}

// An exit at start excused by an outage passes, and the report names its
// cause (addresses left out, so that equal causes count together).
func TestExcusedExitsNameTheirCause(t *testing.T) {
	h := goodHistory("per-message")
	cause := "payments-consumer: consumer: retry topics of t: retrytopic: describe topic t: dial tcp 127.0.0.1:%d: connect: connection refused"
	h.Procs = append(h.Procs,
		Proc{Name: "m2#3", ExitCode: 1, Excused: fmt.Sprintf(cause, 29196)},
		Proc{Name: "m2#4", ExitCode: 1, Excused: fmt.Sprintf(cause, 29194)})
	r := Check(h)
	if !r.OK() {
		t.Fatalf("excused exits failed the run: %v", r.Failed())
	}
	var b strings.Builder
	r.Print(&b)
	if want := "2× " + strings.Replace(fmt.Sprintf(cause, 1), "127.0.0.1:1", "…", 1); !strings.Contains(b.String(), want) {
		t.Fatalf("report does not name the cause %q:\n%s", want, b.String())
	}
}

// A record the producer wrote twice (its first write's ack lost in a broker
// restart: one chaos-seq at two source offsets) is two source records: one
// DLQ copy of each is once per hop (make chaos -transactions, ordering mode,
// 2026-12-04: seq 27491 at offsets 4852 and 4866, each dead-lettered once).
func TestProducerDuplicateIsOncePerHop(t *testing.T) {
	h := goodHistory("per-message")
	h.Transactional = true
	second := h.DLQ[2]
	second.Offset, second.Headers = 99, maps.Clone(second.Headers)
	second.Headers["idem-original-offset"] = "4866"
	h.DLQ = append(h.DLQ, second)
	r := Check(h)
	var b bytes.Buffer
	r.Print(&b)
	if !strings.Contains(b.String(), "ok   each forward once per hop (read_committed)") {
		t.Fatalf("two source records of one seq, each dead-lettered once, failed the invariant:\n%s", b.String())
	}
}

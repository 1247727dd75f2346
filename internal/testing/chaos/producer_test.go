package chaos

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"unicode/utf8"

	"github.com/idemhq/idem/internal/testing/chaos/check"
)

// TestPlan checks the workload the producer sends: every poison kind, linked
// rival pairs, duplicates that repeat a key, and poison that is what its name
// says.
func TestPlan(t *testing.T) {
	w := Workload{Payments: 3000, Customers: 50, DupRate: 0.15, Poison: 0.004, Rivals: 0.005, Flaky: 0.02, Huge: 0.002}
	recs, orders := plan(w, "t", rand.New(rand.NewPCG(1, 2)))
	if len(orders) != w.Payments {
		t.Fatalf("%d orders, want %d", len(orders), w.Payments)
	}
	kinds := map[string]int{}
	keys := map[string]int{}
	for i, r := range recs {
		if r.Seq != int64(i) {
			t.Fatalf("record %d has seq %d", i, r.Seq)
		}
		kinds[r.Kind]++
		if r.Expect == check.ExpectEffect {
			keys[r.Key]++
		}
		switch r.Kind {
		case "rival":
			if p := recs[r.Rival]; p.Rival != r.Seq || p.Order != r.Order || p.KafkaKey != r.KafkaKey || p.Seq > r.Seq {
				t.Fatalf("rival %d is not linked to an earlier payment of its order: %+v", r.Seq, p.Produced)
			}
		case "truncated-json", "huge-headers-poison":
			if json.Valid(r.value) {
				t.Fatalf("%s record %d is valid JSON: %s", r.Kind, r.Seq, r.value)
			}
		case "bad-utf8-body":
			if utf8.Valid(r.value) {
				t.Fatalf("bad-utf8-body record %d is valid UTF-8: %q", r.Seq, r.value)
			}
		}
	}
	for _, k := range []string{"payment", "duplicate", "rival", "huge-headers", "empty-key", "long-key", "bad-utf8-key", "truncated-json", "bad-utf8-body", "huge-headers-poison", "unknown-order"} {
		if kinds[k] == 0 {
			t.Errorf("no %s record in %v", k, kinds)
		}
	}
	dups := 0
	for _, n := range keys {
		dups += n - 1
	}
	if dups != kinds["duplicate"] {
		t.Errorf("%d repeated keys, %d duplicate records", dups, kinds["duplicate"])
	}
}

// A member's exit at start is excused when it could not reach a server; an
// exit for any other cause is not.
func TestOutageExit(t *testing.T) {
	for line, want := range map[string]bool{
		"payments-consumer: create topic payments-lanes: dial tcp 127.0.0.1:29194: connect: connection refused":                                                                                              true,
		"payments-consumer: consumer: consumer: retry topics of p: retrytopic: describe topic p: dial tcp 127.0.0.1:1: connect: connection refused":                                                          true,
		"payments-consumer: consumer: consumer: retry topics of p: retrytopic: describe configs of topic p.g.retry.2: read tcp 127.0.0.1:5->127.0.0.1:1: i/o timeout":                                        true,
		"payments-consumer: consumer: consumer: retry topics of p: retrytopic: PartitionMismatchError":                                                                                                       false,
		"payments-consumer: consumer: handler panicked: dial tcp 127.0.0.1:1: connect: connection refused":                                                                                                   false,
		"payments-consumer: consumer: consumer: metadata: kafka: client has run out of available brokers to talk to: dial tcp 127.0.0.1:59092: connect: connection refused":                                  true,
		"payments-consumer: consumer: consumer: forwarder's producer on [127.0.0.1:59092]: kafka: client has run out of available brokers to talk to: dial tcp 127.0.0.1:59092: connect: connection refused": true,
		"panic: runtime error: index out of range": false,
	} {
		if got := outageExit.MatchString(line); got != want {
			t.Errorf("outageExit(%q) = %v, want %v", line, got, want)
		}
	}
}

// The transactional.id a member logs at start is found in its log line.
func TestTxnIDLine(t *testing.T) {
	for line, want := range map[string]string{
		`time=2026-12-01T18:38:05.424Z level=INFO msg="idem: transactional mode" group=chaos-batched transactional_id=idem-chaos-batched-host_1-0a1b2c commit_interval=100ms`: "idem-chaos-batched-host_1-0a1b2c",
		`time=2026-12-01T18:38:05.424Z level=INFO msg="idem: transactional mode" transactional_id="idem-g-a b" commit_interval=100ms`:                                         "idem-g-a b",
	} {
		g := txnIDLine.FindStringSubmatch(line)
		if g == nil || string(trimQuotes([]byte(g[1]))) != want {
			t.Errorf("%s: got %q, want %q", line, g, want)
		}
	}
}

package wire

import (
	"testing"

	"github.com/IBM/sarama"
)

// TestReplayOf: idem-replay-of round-trips (topic names may hold dots and
// dashes, never '/'), a bad value does not parse, a record replayed a
// second time names only its latest dead letter, and the header is not one
// of the wire contract's (forwards keep it).
func TestReplayOf(t *testing.T) {
	v := ReplayOf("pay.billing-1.dlq", 3, 42)
	if v != "pay.billing-1.dlq/3/42" {
		t.Fatalf("ReplayOf = %q", v)
	}
	if topic, p, o, ok := ParseReplayOf(v); !ok || topic != "pay.billing-1.dlq" || p != 3 || o != 42 {
		t.Fatalf("ParseReplayOf(%q) = %q %d %d %v", v, topic, p, o, ok)
	}
	for _, bad := range []string{"", "t", "t/1", "/1/2", "t/x/2", "t/1/y", "t/-1/2", "t/1/-2", "t/99999999999/1"} {
		if _, _, _, ok := ParseReplayOf(bad); ok {
			t.Errorf("ParseReplayOf(%q) ok", bad)
		}
	}
	hs := []sarama.RecordHeader{{Key: []byte(HeaderReplayOf), Value: []byte("old/0/1")}, {Key: []byte("a"), Value: []byte("b")}}
	out := WithReplayOf(hs, "new", 1, 7)
	if len(out) != 2 || string(out[0].Key) != "a" || string(out[1].Value) != "new/1/7" || string(hs[0].Value) != "old/0/1" {
		t.Fatalf("WithReplayOf = %v (input now %v)", out, hs)
	}
	if IsIdemHeader([]byte(HeaderReplayOf)) || len(StripHeaders(out)) != 2 {
		t.Fatalf("%s is treated as a wire-contract header: forwards would drop it", HeaderReplayOf)
	}
}

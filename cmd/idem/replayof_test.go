package main

import (
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// TestCLIReplayOf: idem dlq replay (the offset model) sends each record with
// idem-replay-of naming its dead letter; when the replay fails again, the
// consumer's forward (wire.Encode) keeps the header, and idem dlq show
// of the new dead letter says which one it was replayed from.
func TestCLIReplayOf(t *testing.T) {
	k := idemtest.Connect(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, topic, origin, 1)
	if code, _, _ := idem(t, k, "", "dlq", "replay", "--topic", topic); code != 0 {
		t.Fatalf("replay: code %d", code)
	}
	replayed := readTopic(t, k, origin)
	if len(replayed) != 1 {
		t.Fatalf("origin has %d records, want 1", len(replayed))
	}
	want := wire.ReplayOf(topic, 0, 0)
	if v, _ := hdr(replayed[0], wire.HeaderReplayOf); v != want {
		t.Fatalf("replayed record: %s = %q, want %q", wire.HeaderReplayOf, v, want)
	}
	// The consumer fails it again and dead-letters it as Run does.
	f := retrytopic.Failure{Attempt: 1, OriginalTopic: origin, Group: "billing", Kind: handler.KindPermanent, Error: "still failing",
		LastFailureAt: time.Now()}
	hs := wire.Encode(replayed[0].Headers, f)
	k.Produce(t, topic, idemtest.Record{Key: replayed[0].Key, Value: replayed[0].Value, Headers: kitHeaders(hs)})
	code, out, _ := idem(t, k, "", "dlq", "show", "--topic", topic, "--partition", "0", "--offset", "1")
	if code != 0 || !strings.Contains(out, "replay-of           "+topic+" partition 0 offset 0") {
		t.Fatalf("show: code %d\n%s", code, out)
	}
}

package dlq

import (
	"errors"
	"testing"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

func TestNormalize(t *testing.T) {
	tests := []struct{ in, want string }{
		{`order 12345 for "alice": lock 0xdeadbeef`, `order <n> for "…": lock <hex>`},
		{"user 3f2a9c1e-0b7d-4c1a-9e3f-2b1c0d9e8f7a not found", "user <uuid> not found"},
		{"trace 5f3a9bc12e not found", "trace <hex> not found"},
		{"it's 'quoted' and `back`", `it's "…" and "…"`},
		{"no numbers here", "no numbers here"},
		{"retry 3 of 10 after 250ms", "retry <n> of <n> after <n>ms"},
	}
	for _, tt := range tests {
		if got := normalize(tt.in); got != tt.want {
			t.Errorf("Normalize(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
	a := fingerprint(handler.KindRetriable, "*net.OpError", "dial 10.0.0.1:5432 refused")
	b := fingerprint(handler.KindRetriable, "*net.OpError", "dial 10.9.9.9:6543 refused")
	c := fingerprint(handler.KindPermanent, "*net.OpError", "dial 10.0.0.1:5432 refused")
	if a != b || a == c || len(a) != 12 {
		t.Errorf("fingerprints %s %s %s", a, b, c)
	}
}

func TestParseFilter(t *testing.T) {
	f, err := ParseFilter("kind=panic, error~=a,b{1,2}c ,key=k-1,fingerprint=abc")
	if err != nil {
		t.Fatal(err)
	}
	if f.Kind != handler.KindPanic || f.Error.String() != "a,b{1,2}c" || f.Key != "k-1" || f.Fingerprint != "abc" {
		t.Fatalf("ParseFilter = %+v (error %q)", f, f.Error)
	}
	if f, err := ParseFilter(""); err != nil || f.Kind != "" || f.Error != nil {
		t.Fatalf("ParseFilter(\"\") = %+v, %v", f, err)
	}
	for _, bad := range []string{"kind=nope", "error~=(", "colour=red", "kind"} {
		if _, err := ParseFilter(bad); !errors.Is(err, errBadFilter) {
			t.Errorf("ParseFilter(%q) = %v, want errBadFilter", bad, err)
		}
	}
	r := &Record{Key: []byte("k-1"), Failure: retrytopic.Failure{Kind: handler.KindPanic, Error: "xx ab,bc yy"}}
	f, _ = ParseFilter("kind=panic,error~=ab?,b+c,key=k-1")
	if !f.Match(r) {
		t.Errorf("filter does not match %+v", r)
	}
	f.Key = "other"
	if f.Match(r) {
		t.Errorf("key filter matched another key")
	}
}

func TestOpenNeverCreatesTopics(t *testing.T) {
	k := testenv.NewKafka(t)
	cfg := k.SaramaConfig()
	cfg.Metadata.AllowAutoTopicCreation = true
	c, err := Open(k.Brokers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if c.client.Config().Metadata.AllowAutoTopicCreation {
		t.Fatal("Open kept Metadata.AllowAutoTopicCreation on")
	}
	if !cfg.Metadata.AllowAutoTopicCreation {
		t.Fatal("Open changed the caller's config")
	}
}

// TestReplayedFrom: a record names the dead letter its last idem-replay-of
// points at; a record without one, or with one that does not parse, names
// none.
func TestReplayedFrom(t *testing.T) {
	hs := wire.WithReplayOf([]sarama.RecordHeader{{Key: []byte("a"), Value: []byte("b")}}, "pay.billing-1.dlq", 1, 7)
	r := &Record{Headers: hs}
	if topic, got, ok := r.ReplayedFrom(); !ok || topic != "pay.billing-1.dlq" || got != (Position{Partition: 1, Offset: 7}) {
		t.Fatalf("ReplayedFrom = %q %+v %v", topic, got, ok)
	}
	if _, _, ok := (&Record{}).ReplayedFrom(); ok {
		t.Fatal("a record without the header was replayed from somewhere")
	}
	bad := &Record{Headers: []sarama.RecordHeader{{Key: []byte(wire.HeaderReplayOf), Value: []byte("t/x/2")}}}
	if _, _, ok := bad.ReplayedFrom(); ok {
		t.Fatal("a header that does not parse named a dead letter")
	}
}

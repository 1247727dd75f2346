package dlq

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testenv"
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
	a := Fingerprint(handler.KindRetriable, "*net.OpError", "dial 10.0.0.1:5432 refused")
	b := Fingerprint(handler.KindRetriable, "*net.OpError", "dial 10.9.9.9:6543 refused")
	c := Fingerprint(handler.KindPermanent, "*net.OpError", "dial 10.0.0.1:5432 refused")
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
		if _, err := ParseFilter(bad); !errors.Is(err, ErrBadFilter) {
			t.Errorf("ParseFilter(%q) = %v, want ErrBadFilter", bad, err)
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

func TestReplayRecord(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	f := retrytopic.Failure{Attempt: 4, OriginalTopic: "pay", OriginalPartition: 2, OriginalOffset: 9, Group: "billing", Kind: handler.KindPermanent, Error: "boom"}
	orig := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("k-1")}}
	failed := &Record{Topic: "pay.billing.dlq", Partition: 1, Offset: 5, Key: []byte("k"), Value: []byte("v"), Headers: wire.Encode(orig, f), Failure: f, HasFailure: true}
	foreign := &Record{Topic: "pay.billing.dlq", Partition: 1, Offset: 6, Key: []byte("k"), Headers: orig}
	tests := []struct {
		name      string
		r         *Record
		to        Destination
		tier      int
		topic     string
		partition int32
		wantTier  int // -1: no idem-* headers expected
	}{
		{"source", failed, ToSource, 0, "pay", 2, -1},
		{"named original topic is source", failed, "pay", 5, "pay", 2, -1},
		{"plain topic", failed, "elsewhere", 0, "elsewhere", 2, 1},
		{"default tier name", failed, Destination(retrytopic.Policy{}.Tier("pay", "billing", 3)), 0, "pay.billing.retry.3", 2, 3},
		{"default name of another group", failed, Destination(retrytopic.Policy{}.Tier("pay", "other", 3)), 0, "pay.other.retry.3", 2, 1},
		{"explicit tier", failed, "custom-two", 2, "custom-two", 2, 2},
		{"record without idem headers", foreign, "elsewhere", 0, "elsewhere", 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := replayRecord(tt.r, ReplayOptions{To: tt.to, Tier: tt.tier, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			if rec.Topic != tt.topic || rec.Partition != tt.partition || string(rec.Key) != "k" {
				t.Fatalf("record to %s/%d key %q, want %s/%d", rec.Topic, rec.Partition, rec.Key, tt.topic, tt.partition)
			}
			// Every replay names its dead letter, last.
			last := rec.Headers[len(rec.Headers)-1]
			if want := fmt.Sprintf("pay.billing.dlq/1/%d", tt.r.Offset); string(last.Key) != ReplayOfHeader || string(last.Value) != want {
				t.Fatalf("last header %s=%s, want %s=%s", last.Key, last.Value, ReplayOfHeader, want)
			}
			got, ok, err := wire.Decode(rec.Headers)
			if tt.wantTier < 0 {
				if ok || len(rec.Headers) != 2 {
					t.Fatalf("headers %d (idem: %v), want the original one and %s", len(rec.Headers), ok, ReplayOfHeader)
				}
				return
			}
			if err != nil || got.Tier != tt.wantTier || !got.DueAt.Equal(now) || got.Attempt != 4 || got.OriginalTopic != "pay" {
				t.Fatalf("headers = %+v, %v; want tier %d due now", got, err, tt.wantTier)
			}
		})
	}
	if _, err := replayRecord(foreign, ReplayOptions{To: ToSource}); !errors.Is(err, ErrNoOrigin) {
		t.Fatalf("source of a record without idem headers: %v, want ErrNoOrigin", err)
	}
}

// TestReplayOf: idem-replay-of round-trips (topic names may hold dots and
// dashes, never '/'), a bad value does not parse, and a record replayed a
// second time names only its latest dead letter.
func TestReplayOf(t *testing.T) {
	p := Position{Partition: 3, Offset: 42}
	v := ReplayOf("pay.billing-1.dlq", p)
	if v != "pay.billing-1.dlq/3/42" {
		t.Fatalf("ReplayOf = %q", v)
	}
	if topic, got, ok := parseReplayOf(v); !ok || topic != "pay.billing-1.dlq" || got != p {
		t.Fatalf("parseReplayOf(%q) = %q %+v %v", v, topic, got, ok)
	}
	for _, bad := range []string{"", "t", "t/1", "/1/2", "t/x/2", "t/1/y", "t/-1/2", "t/1/-2", "t/99999999999/1"} {
		if _, _, ok := parseReplayOf(bad); ok {
			t.Errorf("parseReplayOf(%q) ok", bad)
		}
	}
	hs := []sarama.RecordHeader{{Key: []byte(ReplayOfHeader), Value: []byte("old/0/1")}, {Key: []byte("a"), Value: []byte("b")}}
	out := WithReplayOf(hs, "new", Position{Partition: 1, Offset: 7})
	if len(out) != 2 || string(out[0].Key) != "a" || string(out[1].Value) != "new/1/7" || string(hs[0].Value) != "old/0/1" {
		t.Fatalf("WithReplayOf = %v (input now %v)", out, hs)
	}
	r := &Record{Headers: out}
	if topic, got, ok := r.ReplayedFrom(); !ok || topic != "new" || got != (Position{Partition: 1, Offset: 7}) {
		t.Fatalf("ReplayedFrom = %q %+v %v", topic, got, ok)
	}
	if _, _, ok := (&Record{}).ReplayedFrom(); ok {
		t.Fatal("a record without the header was replayed from somewhere")
	}
}

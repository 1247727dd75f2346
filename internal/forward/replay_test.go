package forward

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// TestBuild: where each destination sends a dead letter, with which headers;
// every replay names its dead letter in idem-replay-of.
func TestBuild(t *testing.T) {
	now := time.UnixMilli(1_800_000_000_000)
	f := retrytopic.Failure{Attempt: 4, OriginalTopic: "pay", OriginalPartition: 2, OriginalOffset: 9, Group: "billing", Kind: handler.KindPermanent, Error: "boom"}
	orig := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("k-1")}}
	failed := DeadLetter{Topic: "pay.billing.dlq", Partition: 1, Offset: 5, Key: []byte("k"), Value: []byte("v"), Headers: wire.Encode(orig, f), Failure: f, HasFailure: true}
	foreign := DeadLetter{Topic: "pay.billing.dlq", Partition: 1, Offset: 6, Key: []byte("k"), Headers: orig}
	tests := []struct {
		name      string
		d         DeadLetter
		to        string
		tier      int
		topic     string
		partition int32
		wantTier  int // -1: no idem-* headers expected
	}{
		{"source", failed, ReplayToSource, 0, "pay", 2, -1},
		{"empty is source", failed, "", 0, "pay", 2, -1},
		{"named original topic is source", failed, "pay", 5, "pay", 2, -1},
		{"plain topic", failed, "elsewhere", 0, "elsewhere", 2, 1},
		{"default tier name", failed, retrytopic.Policy{}.Tier("pay", "billing", 3), 0, "pay.billing.retry.3", 2, 3},
		{"default name of another group", failed, retrytopic.Policy{}.Tier("pay", "other", 3), 0, "pay.other.retry.3", 2, 1},
		{"explicit tier", failed, "custom-two", 2, "custom-two", 2, 2},
		{"record without idem headers", foreign, "elsewhere", 0, "elsewhere", 1, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec, err := Replay(tt.d, tt.to, tt.tier, now)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Topic != tt.topic || rec.Partition != tt.partition || string(rec.Key) != "k" {
				t.Fatalf("record to %s/%d key %q, want %s/%d", rec.Topic, rec.Partition, rec.Key, tt.topic, tt.partition)
			}
			// Every replay names its dead letter, last.
			last := rec.Headers[len(rec.Headers)-1]
			if want := fmt.Sprintf("pay.billing.dlq/1/%d", tt.d.Offset); string(last.Key) != wire.HeaderReplayOf || string(last.Value) != want {
				t.Fatalf("last header %s=%s, want %s=%s", last.Key, last.Value, wire.HeaderReplayOf, want)
			}
			got, ok, err := wire.Decode(rec.Headers)
			if tt.wantTier < 0 {
				if ok || len(rec.Headers) != 2 {
					t.Fatalf("headers %d (idem: %v), want the original one and %s", len(rec.Headers), ok, wire.HeaderReplayOf)
				}
				return
			}
			if err != nil || got.Tier != tt.wantTier || !got.DueAt.Equal(now) || got.Attempt != 4 || got.OriginalTopic != "pay" {
				t.Fatalf("headers = %+v, %v; want tier %d due now", got, err, tt.wantTier)
			}
		})
	}
	if _, err := Replay(foreign, ReplayToSource, 0, now); !errors.Is(err, ErrNoOrigin) {
		t.Fatalf("source of a record without idem headers: %v, want ErrNoOrigin", err)
	}
	stub := failed
	stub.Failure.Stub = true
	if _, err := Replay(stub, "elsewhere", 0, now); err == nil {
		t.Fatal("a stub was replayed")
	}
}

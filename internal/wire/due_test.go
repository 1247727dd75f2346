package wire

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/retrytopic"
)

// An idem-due-at written by Encode and read by Decode is never before the
// true due time, and at most a millisecond after it: a tier record can never
// run before failure + delay (the 999.85ms flake of
// TestAlwaysFailingReachesDLQThroughTiers came from truncating to the ms).
func TestDueAtNeverEarly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dues := []time.Time{
		time.UnixMilli(1_700_000_000_000),                      // whole millisecond: unchanged
		time.UnixMilli(1_700_000_000_000).Add(time.Nanosecond), // just past: next ms
		time.UnixMilli(1_700_000_000_000).Add(999_999),         // just before the next ms
		time.UnixMilli(-1_000).Add(-time.Nanosecond),           // before 1970: still rounded up
		time.Now(), time.Now().Add(time.Second), time.Now().Add(time.Hour), // with monotonic readings
	}
	for range 1000 {
		dues = append(dues, time.Unix(0, rng.Int64N(4_000_000_000_000_000_000)))
	}
	for _, due := range dues {
		hs := Encode([]sarama.RecordHeader(nil), retrytopic.Failure{Tier: 1, DueAt: due})
		f, _, err := Decode(hs)
		if err != nil {
			t.Fatal(err)
		}
		if f.DueAt.Before(due) {
			t.Fatalf("due %s decoded as %s: %s early", due, f.DueAt, due.Sub(f.DueAt))
		}
		if f.DueAt.Sub(due.Round(0)) >= time.Millisecond {
			t.Fatalf("due %s decoded as %s: more than 1ms late", due, f.DueAt)
		}
		if dueMilli(f.DueAt) != f.DueAt.UnixMilli() {
			t.Fatalf("dueMilli is not stable on a whole millisecond: %s", f.DueAt)
		}
	}
}

// Stub and ForwardError survive the codec; idem-payload-omitted appears only
// on stubs.
func TestStubHeaders(t *testing.T) {
	f := sampleFailure()
	f.Tier, f.DueAt = 0, time.Time{}
	f.Stub, f.OmittedBytes, f.ForwardError = true, 2<<20, "kafka server: Message was too large"
	got, _, err := Decode(Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("k")}}, f))
	if err != nil {
		t.Fatal(err)
	}
	equalFailure(t, got, f)
	hs := Encode([]sarama.RecordHeader(nil), sampleFailure())
	if v := valueOf(hs, HeaderPayloadOmitted); v != nil {
		t.Fatalf("%s = %q on a whole record", HeaderPayloadOmitted, v)
	}
	if v := valueOf(hs, HeaderForwardError); v != nil {
		t.Fatalf("%s = %q with no forward error", HeaderForwardError, v)
	}
}

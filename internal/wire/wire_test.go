package wire

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/retrytopic"
)

func ms(n int64) time.Time { return time.UnixMilli(n) }

func sampleFailure() retrytopic.Failure {
	return retrytopic.Failure{
		Attempt: 4, Tier: 2, DueAt: ms(1_700_000_010_000),
		OriginalTopic: "payments", OriginalPartition: 3, OriginalOffset: 12345,
		OriginalTimestamp: ms(1_700_000_000_000), Group: "billing",
		Error: "charge: upstream said \"no\"", Kind: handler.KindRetriable, ErrorType: "*errors.errorString",
		Stack:          []byte("goroutine 1 [running]:\nmain.main()"),
		FirstFailureAt: ms(1_700_000_001_000), LastFailureAt: ms(1_700_000_009_000),
		IdempotencyKey: "k-1", OmittedHeaders: 2,
		SchemaID: 1 << 31, SchemaSubject: "payments-value",
	}
}

func equalFailure(t *testing.T, got, want retrytopic.Failure) {
	t.Helper()
	norm := func(f retrytopic.Failure) retrytopic.Failure {
		for _, p := range []*time.Time{&f.DueAt, &f.OriginalTimestamp, &f.FirstFailureAt, &f.LastFailureAt} {
			if p.IsZero() {
				*p = time.Time{}
			} else {
				*p = time.UnixMilli(p.UnixMilli())
			}
		}
		if len(f.Stack) == 0 {
			f.Stack = nil
		}
		return f
	}
	if g, w := norm(got), norm(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("decoded failure differs\n got: %+v\nwant: %+v", g, w)
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	orig := []sarama.RecordHeader{
		{Key: []byte("idempotency-key"), Value: []byte("k-1")},
		{Key: []byte("idem-attempt"), Value: []byte("1")},
		{Key: []byte("trace"), Value: []byte{0xff, 0x00}},
		{Key: []byte("idem-something-old"), Value: []byte("x")}, // not the wire contract's: the record's own
		{Key: []byte("empty"), Value: nil},
		{Key: []byte(HeaderIdempotencyKey), Value: []byte("stale")},
	}
	f := sampleFailure()
	hs := Encode(orig, f)

	// Original non-idem headers first, in order, bytes unchanged.
	want := []string{"idempotency-key", "trace", "idem-something-old", "empty"}
	for i, k := range want {
		if string(hs[i].Key) != k {
			t.Fatalf("header %d = %q, want %q", i, hs[i].Key, k)
		}
	}
	if !bytes.Equal(hs[1].Value, []byte{0xff, 0x00}) {
		t.Fatalf("trace header value changed: %v", hs[1].Value)
	}
	// Every idem header once.
	count := map[string]int{}
	for _, h := range hs[len(want):] {
		if !IsIdemHeader(h.Key) {
			t.Fatalf("non-idem header %q after the originals", h.Key)
		}
		if !utf8.Valid(h.Value) {
			t.Fatalf("header %s is not UTF-8", h.Key)
		}
		count[string(h.Key)]++
	}
	for _, k := range []string{HeaderAttempt, HeaderTier, HeaderDueAt, HeaderOriginalTopic, HeaderOriginalPartition,
		HeaderOriginalOffset, HeaderOriginalTimestamp, HeaderConsumerGroup, HeaderError, HeaderErrorKind,
		HeaderErrorType, HeaderStack, HeaderFirstFailureAt, HeaderLastFailureAt, HeaderIdempotencyKey, HeaderHeadersOmitted} {
		if count[k] != 1 {
			t.Errorf("header %s appears %d times, want 1", k, count[k])
		}
	}
	if got := string(valueOf(hs, HeaderIdempotencyKey)); got != "k-1" {
		t.Errorf("idem-idempotency-key = %q, want the failure's k-1, not the stale one", got)
	}
	if got := string(valueOf(hs, HeaderDueAt)); got != "1700000010000" {
		t.Errorf("idem-due-at = %q, want unix ms", got)
	}

	got, ok, err := Decode(hs)
	if err != nil || !ok {
		t.Fatalf("Decode: ok=%v err=%v", ok, err)
	}
	equalFailure(t, got, f)

	// Re-encoding a forwarded record replaces, never duplicates.
	f2 := f
	f2.Attempt, f2.Tier = 5, 3
	hs2 := Encode(hs, f2)
	if len(hs2) != len(hs) {
		t.Fatalf("re-encode: %d headers, want %d", len(hs2), len(hs))
	}
	got2, _, _ := Decode(hs2)
	equalFailure(t, got2, f2)

	// The consumer's pointer headers and handler headers decode the same.
	ptrs := make([]*sarama.RecordHeader, len(hs))
	hh := make([]handler.Header, len(hs))
	for i := range hs {
		ptrs[i] = &hs[i]
		hh[i] = handler.Header{Key: string(hs[i].Key), Value: hs[i].Value}
	}
	ptrs = append(ptrs, nil)
	gp, _, err := Decode(ptrs)
	if err != nil {
		t.Fatal(err)
	}
	equalFailure(t, gp, f)
	gh, _, err := Decode(hh)
	if err != nil {
		t.Fatal(err)
	}
	equalFailure(t, gh, f)
}

func valueOf(hs []sarama.RecordHeader, k string) []byte {
	for _, h := range hs {
		if string(h.Key) == k {
			return h.Value
		}
	}
	return nil
}

func TestDecodeNoIdemHeaders(t *testing.T) {
	f, ok, err := Decode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("x")}})
	if ok || err != nil || !reflect.DeepEqual(f, retrytopic.Failure{}) {
		t.Fatalf("Decode = %+v %v %v, want zero, false, nil", f, ok, err)
	}
}

func TestDecodeBadValue(t *testing.T) {
	hs := []sarama.RecordHeader{
		{Key: []byte(HeaderAttempt), Value: []byte("three")},
		{Key: []byte(HeaderOriginalTopic), Value: []byte("payments")},
	}
	f, ok, err := Decode(hs)
	var he *invalidHeaderError
	if !ok || !errors.As(err, &he) || he.Header != HeaderAttempt {
		t.Fatalf("Decode: ok=%v err=%v, want *invalidHeaderError for %s", ok, err, HeaderAttempt)
	}
	if f.OriginalTopic != "payments" {
		t.Fatalf("other fields not decoded: %+v", f)
	}
}

func TestEncodeCapsStack(t *testing.T) {
	f := retrytopic.Failure{Stack: bytes.Repeat([]byte("é"), MaxStackBytes), Error: strings.Repeat("x", MaxErrorBytes+10) + "\xff"}
	hs := Encode([]sarama.RecordHeader(nil), f)
	st := valueOf(hs, HeaderStack)
	if len(st) > MaxStackBytes || len(st) < MaxStackBytes-4 || !utf8.Valid(st) {
		t.Fatalf("stack header: %d bytes, valid UTF-8 %v", len(st), utf8.Valid(st))
	}
	if e := valueOf(hs, HeaderError); len(e) != MaxErrorBytes || !utf8.Valid(e) {
		t.Fatalf("error header: %d bytes", len(e))
	}
}

type myErr struct{}

func (myErr) Error() string { return "mine" }

func TestNewFailure(t *testing.T) {
	now := ms(1_700_000_100_000)
	src := Source{Topic: "payments.billing.retry.1", Partition: 2, Offset: 77, Timestamp: ms(1_700_000_090_000), Group: "billing"}

	t.Run("fresh record takes the source coordinates", func(t *testing.T) {
		f := NewFailure(handler.Permanent(fmt.Errorf("wrap: %w", myErr{})), src, retrytopic.Failure{}, now)
		if f.OriginalTopic != src.Topic || f.OriginalOffset != 77 || f.OriginalPartition != 2 || !f.OriginalTimestamp.Equal(src.Timestamp) {
			t.Errorf("original coordinates = %+v", f)
		}
		if !f.FirstFailureAt.Equal(now) || !f.LastFailureAt.Equal(now) || f.Attempt != 1 || f.Group != "billing" {
			t.Errorf("times/attempt = %+v", f)
		}
		if f.Kind != handler.KindPermanent || f.ErrorType != "*fmt.wrapError" || f.Error != "wrap: mine" {
			t.Errorf("error fields = %q %q %q", f.Kind, f.ErrorType, f.Error)
		}
	})
	t.Run("forwarded record keeps its original coordinates", func(t *testing.T) {
		prior := sampleFailure()
		f := NewFailure(&handler.PanicError{Value: "boom", Stack: []byte("stack")}, src, prior, now)
		if f.OriginalTopic != "payments" || f.OriginalPartition != 3 || f.OriginalOffset != 12345 || !f.OriginalTimestamp.Equal(prior.OriginalTimestamp) {
			t.Errorf("original coordinates overwritten: %+v", f)
		}
		if !f.FirstFailureAt.Equal(prior.FirstFailureAt) || !f.LastFailureAt.Equal(now) || f.Attempt != prior.Attempt+1 {
			t.Errorf("times/attempt = %+v", f)
		}
		if f.Kind != handler.KindPanic || string(f.Stack) != "stack" || f.ErrorType != "*handler.PanicError" {
			t.Errorf("panic fields = %q %q %q", f.Kind, f.Stack, f.ErrorType)
		}
	})
	t.Run("retry-after keeps the underlying type", func(t *testing.T) {
		f := NewFailure(handler.RetryAfter(myErr{}, time.Second), src, retrytopic.Failure{}, now)
		if f.ErrorType != "wire.myErr" || f.Kind != handler.KindRetriable {
			t.Errorf("ErrorType = %q kind %q", f.ErrorType, f.Kind)
		}
	})
}

func FuzzCodec(f *testing.F) {
	s := sampleFailure()
	f.Add(int32(s.Attempt), int32(s.Tier), s.DueAt.UnixMilli(), s.OriginalTopic, s.OriginalPartition, s.OriginalOffset,
		s.OriginalTimestamp.UnixMilli(), s.Group, s.Error, string(s.Kind), s.ErrorType, s.Stack,
		s.FirstFailureAt.UnixMilli(), s.LastFailureAt.UnixMilli(), "idempotency-key", []byte("k"))
	f.Add(int32(0), int32(0), int64(0), "", int32(0), int64(0), int64(0), "", "", "", "", []byte(nil), int64(0), int64(-1), "idem-x", []byte("\xff"))
	f.Fuzz(func(t *testing.T, attempt, tier int32, due int64, otopic string, opart int32, ooff int64, ots int64,
		group, msg, kind, typ string, stack []byte, first, last int64, hk string, hv []byte) {
		in := retrytopic.Failure{
			Attempt: int(attempt), Tier: int(tier), DueAt: ms(due),
			OriginalTopic: otopic, OriginalPartition: opart, OriginalOffset: ooff, OriginalTimestamp: ms(ots),
			Group: group, Error: msg, Kind: handler.Kind(kind), ErrorType: typ, Stack: stack,
			FirstFailureAt: ms(first), LastFailureAt: ms(last),
		}
		orig := []sarama.RecordHeader{{Key: []byte(hk), Value: hv}}
		hs := Encode(orig, in)
		got, ok, err := Decode(hs)
		if err != nil || !ok {
			t.Fatalf("Decode(Encode(f)): ok=%v err=%v", ok, err)
		}
		want := in
		want.Error = capUTF8(in.Error, MaxErrorBytes)
		want.Stack = []byte(capUTF8(string(in.Stack), MaxStackBytes))
		equalFailure(t, got, want)
		// Non-idem headers survive, idem ones never repeat.
		keep := StripHeaders(hs)
		if IsIdemHeader([]byte(hk)) {
			if len(keep) != 0 {
				t.Fatalf("stale idem header kept: %q", keep)
			}
		} else if len(keep) != 1 || string(keep[0].Key) != hk || !bytes.Equal(keep[0].Value, hv) {
			t.Fatalf("original header changed: %q", keep)
		}
		noRepeatedIdemHeader(t, hs)
		// Decode must not panic on arbitrary values either.
		_, _, _ = Decode([]sarama.RecordHeader{{Key: []byte(HeaderAttempt), Value: []byte(msg)}, {Key: []byte(hk), Value: hv}})
	})
}

// noRepeatedIdemHeader fails t when an idem-* header appears twice in hs.
func noRepeatedIdemHeader(t *testing.T, hs []sarama.RecordHeader) {
	t.Helper()
	seen := map[string]bool{}
	for _, h := range hs {
		if IsIdemHeader(h.Key) {
			if seen[string(h.Key)] {
				t.Fatalf("header %s repeated", h.Key)
			}
			seen[string(h.Key)] = true
		}
	}
}

// Issue 18 #12: only the wire contract's own headers are idem's. Any other
// header, idem- prefix or not (outbox.Relay's idem-outbox-id, a header a
// later version may add), is the record's own: Encode and StripHeaders keep
// it, and Decode does not take a record carrying only such a header for a
// forwarded one.
func TestOnlyWireHeadersAreStripped(t *testing.T) {
	orig := []sarama.RecordHeader{
		{Key: []byte("idem-outbox-id"), Value: []byte("42")},
		{Key: []byte(HeaderAttempt), Value: []byte("3")},
		{Key: []byte("idem-custom"), Value: []byte("x")},
	}
	keep := StripHeaders(orig)
	if len(keep) != 2 || string(keep[0].Key) != "idem-outbox-id" || string(keep[1].Key) != "idem-custom" {
		t.Fatalf("StripHeaders kept %q, want idem-outbox-id and idem-custom", keep)
	}
	hs := Encode(orig, sampleFailure())
	var outbox int
	for _, h := range hs {
		if string(h.Key) == "idem-outbox-id" {
			outbox++
			if string(h.Value) != "42" {
				t.Fatalf("idem-outbox-id = %q, want 42", h.Value)
			}
		}
	}
	if outbox != 1 {
		t.Fatalf("Encode kept idem-outbox-id %d times, want once: %q", outbox, hs)
	}
	if IsIdemHeader([]byte("idem-outbox-id")) {
		t.Fatal("IsIdemHeader(idem-outbox-id) = true; it is not part of the wire contract")
	}
	if _, ok, _ := Decode(orig[:1]); ok {
		t.Fatal("Decode took a record with only idem-outbox-id for a forwarded one")
	}
}

// schemaErr is an error naming a registry schema, as serde's *DecodeError
// does.
type schemaErr struct{}

func (schemaErr) Error() string                       { return "payload does not decode" }
func (schemaErr) SchemaRef() (id int, subject string) { return 42, "orders-value" }

// A decode failure that names its schema carries it in idem-schema-id and
// idem-schema-subject; other failures carry neither.
func TestNewFailureSchemaRef(t *testing.T) {
	src := Source{Topic: "orders", Group: "g"}
	f := NewFailure(handler.Decode(fmt.Errorf("serde: %w", schemaErr{})), src, retrytopic.Failure{}, time.Now())
	if f.SchemaID != 42 || f.SchemaSubject != "orders-value" || f.Kind != handler.KindDecode {
		t.Fatalf("failure %+v: want schema 42 orders-value, kind decode", f)
	}
	hs := Encode([]sarama.RecordHeader(nil), f)
	got, _, err := Decode(hs)
	if err != nil || got.SchemaID != 42 || got.SchemaSubject != "orders-value" {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	plain := Encode([]sarama.RecordHeader(nil), NewFailure(errors.New("boom"), src, retrytopic.Failure{}, time.Now()))
	for _, h := range plain {
		if k := string(h.Key); k == HeaderSchemaID || k == HeaderSchemaSubject {
			t.Fatalf("a failure without a schema carries %s", k)
		}
	}
}

package wire

import (
	"bytes"
	"testing"

	"github.com/IBM/sarama"
)

// fuzzHeaders turns raw into headers: one header per line, "key=value" split
// at the first '=' (a line without '=' is a key with a nil value). Keys and
// values keep every byte (NULs, invalid UTF-8); the same key may repeat.
// grow > 0 makes the last value huge: it is repeated grow times.
func fuzzHeaders(raw []byte, grow uint16) []sarama.RecordHeader {
	var hs []sarama.RecordHeader
	for line := range bytes.SplitSeq(raw, []byte("\n")) {
		k, v, found := bytes.Cut(line, []byte("="))
		h := sarama.RecordHeader{Key: k}
		if found {
			h.Value = v
		}
		hs = append(hs, h)
	}
	if n := len(hs); n > 0 && grow > 0 && len(hs[n-1].Value) > 0 {
		hs[n-1].Value = bytes.Repeat(hs[n-1].Value, int(grow))
	}
	return hs
}

// FuzzDecode feeds Decode arbitrary headers. It must never panic; whatever it
// decodes must survive Encode and Decode again unchanged (up to Encode's
// documented caps and UTF-8 repair), with the non-idem headers kept in order
// and no idem-* header repeated.
//
// The seed corpus is testdata/fuzz/FuzzDecode (duplicate headers, NULs,
// invalid UTF-8, huge and out-of-range numbers, a stub); `go test` runs it
// as an ordinary test, `go test -fuzz FuzzDecode ./internal/wire` explores.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("idempotency-key=k-1\nidem-attempt=3\nidem-tier=1\nidem-due-at=1700000000001"), uint16(0))
	f.Fuzz(func(t *testing.T, raw []byte, grow uint16) {
		hs := fuzzHeaders(raw, grow%2048)
		got, ok, err := Decode(hs)
		_, _, _ = Decode(toPointers(hs))
		if !ok {
			if err != nil {
				t.Fatalf("no idem header, but an error: %v", err)
			}
			return
		}
		enc := Encode(hs, got)
		again, ok2, err := Decode(enc)
		if !ok2 || err != nil {
			t.Fatalf("Decode(Encode(Decode(hs))): ok=%v err=%v", ok2, err)
		}
		want := got
		want.Error = capUTF8(got.Error, MaxErrorBytes)
		want.ForwardError = capUTF8(got.ForwardError, MaxErrorBytes)
		want.Stack = []byte(capUTF8(string(got.Stack), MaxStackBytes))
		equalFailure(t, again, want)
		keep := StripHeaders(enc)
		orig := StripHeaders(hs)
		if len(keep) != len(orig) {
			t.Fatalf("%d original headers became %d", len(orig), len(keep))
		}
		for i := range keep {
			if !bytes.Equal(keep[i].Key, orig[i].Key) || !bytes.Equal(keep[i].Value, orig[i].Value) {
				t.Fatalf("original header %d changed: %q=%q, was %q=%q", i, keep[i].Key, keep[i].Value, orig[i].Key, orig[i].Value)
			}
		}
		noRepeatedIdemHeader(t, enc)
	})
}

func toPointers(hs []sarama.RecordHeader) []*sarama.RecordHeader {
	out := make([]*sarama.RecordHeader, 0, len(hs)+1)
	for i := range hs {
		out = append(out, &hs[i])
	}
	return append(out, nil) // a nil header pointer is skipped, never dereferenced
}

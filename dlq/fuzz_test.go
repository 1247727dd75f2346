package dlq

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/wire"
)

// Fuzz headers are given as one byte string: entries separated by 0x1E, each
// "name 0x1F value" (no 0x1F: a nil value). An empty entry between two
// separators stands for a nil *sarama.RecordHeader, as a consumer may hand
// one over.
const (
	fuzzHeaderSep = 0x1e
	fuzzValueSep  = 0x1f
)

// fuzzHeaders decodes the fuzz form of headers into what the consumer gives
// (nil entries included) and the headers a Record must keep (nil ones
// dropped), in order.
func fuzzHeaders(b []byte) (consumed []*sarama.RecordHeader, kept []sarama.RecordHeader) {
	if len(b) == 0 {
		return nil, nil
	}
	for _, e := range bytes.Split(b, []byte{fuzzHeaderSep}) {
		if len(e) == 0 {
			consumed = append(consumed, nil)
			continue
		}
		h := sarama.RecordHeader{Key: e}
		if k, v, ok := bytes.Cut(e, []byte{fuzzValueSep}); ok {
			h = sarama.RecordHeader{Key: k, Value: v}
		}
		consumed = append(consumed, &h)
		kept = append(kept, h)
	}
	return consumed, kept
}

func sameBytes(a, b []byte) bool { return bytes.Equal(a, b) && (a == nil) == (b == nil) }

// FuzzRecord drives what turns a consumed dead-letter record into a Record,
// its Fingerprint, a List Group and a Filter match, with arbitrary key, value
// and headers (invalid UTF-8, NULs, huge values, idem-* headers that do not
// parse). None may panic; key, value and headers are kept byte for byte; the
// fingerprint is 12 hex digits and depends only on kind, type and the
// normalised message. The seed corpus is in testdata/fuzz/FuzzRecord; run
// `go test -run '^$' -fuzz FuzzRecord ./dlq` to search further.
func FuzzRecord(f *testing.F) {
	// Huge values (kept out of the committed corpus for its size). idem-error
	// is 16 KiB here: Encode caps it at 8 KiB on the wire, and the
	// fingerprint's regexps run over all of it.
	huge := bytes.Repeat([]byte{0xff, 0x00, 'x', 0x1b}, 1<<19) // 2 MiB
	f.Add([]byte("k"), huge, append([]byte("idem-stack\x1f"), huge...), false, false)
	f.Add(huge, []byte("v"), append(append([]byte("idempotency-key\x1f"), huge...), append([]byte("\x1eidem-error\x1f"), huge[:16<<10]...)...), false, false)
	f.Fuzz(func(t *testing.T, key, value, headers []byte, nilKey, nilValue bool) {
		if nilKey {
			key = nil
		}
		if nilValue {
			value = nil
		}
		consumed, kept := fuzzHeaders(headers)
		ts := time.UnixMilli(1_700_000_000_000)
		r := newRecord(&sarama.ConsumerMessage{Topic: "t.g.dlq", Partition: 3, Offset: 42, Timestamp: ts, Key: key, Value: value, Headers: consumed})

		if !sameBytes(r.Key, key) || !sameBytes(r.Value, value) {
			t.Fatalf("key/value not kept: %q/%q, want %q/%q", r.Key, r.Value, key, value)
		}
		if r.Topic != "t.g.dlq" || r.Partition != 3 || r.Offset != 42 || !r.Timestamp.Equal(ts) {
			t.Fatalf("coordinates changed: %s/%d@%d %s", r.Topic, r.Partition, r.Offset, r.Timestamp)
		}
		if len(r.Headers) != len(kept) {
			t.Fatalf("%d headers, want %d", len(r.Headers), len(kept))
		}
		hasIdem, idemKey, derived := false, "", false
		var original []sarama.RecordHeader
		for i, h := range kept {
			if !sameBytes(r.Headers[i].Key, h.Key) || !sameBytes(r.Headers[i].Value, h.Value) {
				t.Fatalf("header %d = %q: %q, want %q: %q", i, r.Headers[i].Key, r.Headers[i].Value, h.Key, h.Value)
			}
			if wire.IsIdemHeader(h.Key) {
				hasIdem = true
			} else {
				original = append(original, h)
			}
			if string(h.Key) == idempotencyKeyHeader && !derived {
				idemKey = string(h.Value)
			}
			if string(h.Key) == derivedKeyHeader {
				idemKey, derived = string(h.Value), true
			}
		}
		if r.HasFailure != hasIdem {
			t.Fatalf("HasFailure = %v, want %v", r.HasFailure, hasIdem)
		}
		if got := r.OriginalHeaders(); len(got) != len(original) {
			t.Fatalf("OriginalHeaders = %d headers, want %d", len(got), len(original))
		} else {
			for i := range got {
				if !sameBytes(got[i].Key, original[i].Key) || !sameBytes(got[i].Value, original[i].Value) {
					t.Fatalf("OriginalHeaders[%d] = %q, want %q", i, got[i].Key, original[i].Key)
				}
			}
		}
		if r.IdempotencyKey() != idemKey {
			t.Fatalf("IdempotencyKey = %q, want %q", r.IdempotencyKey(), idemKey)
		}

		fp := r.Fingerprint()
		if _, err := hex.DecodeString(fp); err != nil || len(fp) != 12 {
			t.Fatalf("Fingerprint = %q, want 12 hex digits", fp)
		}
		if fp != fingerprint(r.Failure.Kind, r.Failure.ErrorType, r.Failure.Error) || fp != r.Fingerprint() {
			t.Fatal("Fingerprint is not a function of kind, type and message")
		}
		if r.LastFailureAt().IsZero() && !r.Failure.LastFailureAt.IsZero() {
			t.Fatal("LastFailureAt lost idem-last-failure-at")
		}

		g := newGroup(r, fp)
		g.add(r)
		g.add(r)
		if g.Count != 2 || g.Fingerprint != fp || g.Message != normalize(r.Failure.Error) || g.SampleError != r.Failure.Error ||
			!g.FirstSeen.Equal(r.LastFailureAt()) || !g.LastSeen.Equal(g.FirstSeen) {
			t.Fatalf("group = %+v", g)
		}
		if _, err := json.Marshal(g); err != nil {
			t.Fatalf("group does not encode: %v", err)
		}

		flt := Filter{Kind: r.Failure.Kind, Key: string(r.Key), Fingerprint: fp[:4]}
		if utf8.ValidString(r.Failure.Error) {
			flt.Error = regexp.MustCompile(regexp.QuoteMeta(r.Failure.Error))
		}
		if !flt.Match(r) {
			t.Fatalf("a filter built from the record does not match it: %+v", flt)
		}
	})
}

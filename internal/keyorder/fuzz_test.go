package keyorder

import (
	"bytes"
	"context"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// headersFrom turns fuzz bytes into headers: each is a name length byte, the
// name, a flag byte (even: null value) and, for a value, a length byte and
// the value. Truncated input ends the list.
func headersFrom(b []byte) []Header {
	var hs []Header
	for len(b) >= 2 {
		n := int(b[0]) % 16
		b = b[1:]
		if len(b) < n+1 {
			break
		}
		h := Header{Key: string(b[:n])}
		flag := b[n]
		b = b[n+1:]
		if flag%2 == 1 && len(b) > 0 {
			m := min(int(b[0])%32, len(b)-1)
			h.Value = append([]byte{}, b[1:1+m]...) // may be empty, never nil
			b = b[1+m:]
		}
		hs = append(hs, h)
	}
	return hs
}

// FuzzParkRoundTrip checks that a Record survives being parked (the columns of
// idem_ordering_parked) and being recorded as a pending forward (the JSON of
// heads.pending) byte for byte: header names that are not UTF-8 or hold NULs,
// empty names, null versus empty values and payloads. Its seed corpus is in
// testdata/fuzz/FuzzParkRoundTrip; `go test` runs it as a unit test.
func FuzzParkRoundTrip(f *testing.F) {
	f.Add("orders", []byte("K"), "ikey-1", []byte(`{"n":1}`), false, []byte("\x0fidempotency-key\x01\x06ikey-1"), int64(1_700_000_000_000))
	f.Add("t", []byte{0xff, 0x00}, "k", []byte{}, false, []byte("\x02\xff\xfe\x01\x03a\x00b\x00\x00\x01\x00"), int64(0))
	f.Add("t", []byte("K"), "k", []byte(nil), true, []byte("\x03a\x00b\x00"), int64(-1))
	f.Fuzz(func(t *testing.T, topic string, key []byte, ikey string, value []byte, nilValue bool, hdrs []byte, ms int64) {
		// Topics and idempotency keys are valid UTF-8 without NUL before they
		// get here (Kafka topic names are ASCII; the consumer rejects other
		// keys).
		clean := func(s string) string { return strings.ReplaceAll(strings.ToValidUTF8(s, "?"), "\x00", "") }
		topic, ikey = clean(topic), clean(ikey)
		if nilValue {
			value = nil
		} else if value == nil {
			value = []byte{}
		}
		ms %= 253_402_300_799_000 // JSON times stay within years 0000–9999
		if ms < 0 {
			ms = -ms % 62_135_596_800_000
		}
		r := Record{
			Seq: 7, Topic: topic, Key: key, IdempotencyKey: ikey, Partition: 3, Offset: ms,
			Timestamp: time.UnixMilli(ms).UTC(), Value: value, Headers: headersFrom(hdrs),
		}

		w := toParkedRow(r)
		if w.headerKeys == nil || w.headerValues == nil {
			t.Fatal("header columns are NOT NULL but encoded as nil")
		}
		back, err := w.record(topic, key)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "parked", r, back)

		s := &Store{}
		b, err := s.encodePending(context.Background(), nil, r)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.Valid(b) || bytes.Contains(b, []byte(`\u0000`)) {
			t.Fatalf("pending JSON is not UTF-8 without NUL (jsonb refuses it): %q", b)
		}
		back, err = s.decodePending(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		same(t, "pending", r, back)
	})
}

// same fails unless got restores want: equal fields, equal instants, and
// headers and values identical including nil (null) versus empty.
func same(t *testing.T, via string, want, got Record) {
	t.Helper()
	if !got.Timestamp.Equal(want.Timestamp) {
		t.Fatalf("%s: timestamp %v, want %v", via, got.Timestamp, want.Timestamp)
	}
	if (got.Value == nil) != (want.Value == nil) || !bytes.Equal(got.Value, want.Value) {
		t.Fatalf("%s: value %#v, want %#v", via, got.Value, want.Value)
	}
	if len(got.Headers) != len(want.Headers) {
		t.Fatalf("%s: %d headers, want %d", via, len(got.Headers), len(want.Headers))
	}
	for i, h := range want.Headers {
		g := got.Headers[i]
		if g.Key != h.Key || (g.Value == nil) != (h.Value == nil) || !bytes.Equal(g.Value, h.Value) {
			t.Fatalf("%s: header %d = %q:%#v, want %q:%#v", via, i, g.Key, g.Value, h.Key, h.Value)
		}
	}
	if !bytes.Equal(got.Key, want.Key) {
		t.Fatalf("%s: key %q, want %q", via, got.Key, want.Key)
	}
	got.Timestamp, want.Timestamp = time.Time{}, time.Time{}
	got.Value, want.Value, got.Headers, want.Headers, got.Key, want.Key = nil, nil, nil, nil, nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: %+v, want %+v", via, got, want)
	}
}

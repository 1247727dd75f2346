package seal

import (
	"bytes"
	"errors"
	"testing"
)

// TestPackRoundTrip: Unpack restores what Pack packed byte for byte: a nil
// value apart from an empty one, a null header value apart from an empty
// one, names that are not UTF-8; bytes Pack did not write are refused.
func TestPackRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		name    string
		value   []byte
		headers []Header
	}{
		{"nil value, no headers", nil, nil},
		{"empty value", []byte{}, nil},
		{"value and headers", []byte("card 4111"), []Header{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: nil}, {Key: []byte("\xff\x00"), Value: []byte{}}}},
	} {
		v, hs, err := Unpack(Pack(tt.value, tt.headers))
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if (v == nil) != (tt.value == nil) || !bytes.Equal(v, tt.value) || len(hs) != len(tt.headers) {
			t.Fatalf("%s: value %q (nil %v), %d headers", tt.name, v, v == nil, len(hs))
		}
		for i, h := range hs {
			w := tt.headers[i]
			if !bytes.Equal(h.Key, w.Key) || (h.Value == nil) != (w.Value == nil) || !bytes.Equal(h.Value, w.Value) {
				t.Fatalf("%s: header %d = %q:%q, want %q:%q", tt.name, i, h.Key, h.Value, w.Key, w.Value)
			}
		}
	}
	for _, bad := range [][]byte{nil, {2}, {1, 5, 'a'}, {0, 3, 'a'}} {
		if _, _, err := Unpack(bad); !errors.Is(err, errBadPayload) || !Unreadable(err) {
			t.Errorf("Unpack(%q) = %v, want an unreadable payload", bad, err)
		}
	}
	if bytes.Equal(AAD("a", "bc"), AAD("ab", "c")) {
		t.Error("AAD of different parts is the same")
	}
}

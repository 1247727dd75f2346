package dlq

import (
	"errors"
	"testing"

	"github.com/idemhq/idem/handler"
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
		if got := Normalize(tt.in); got != tt.want {
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

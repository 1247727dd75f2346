package console

import (
	"errors"
	"testing"
)

func TestMask(t *testing.T) {
	m, err := newMasker([]string{"card.number", "$.customer.*.iban", "items.*.pan", "secret"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		in, want string
		n        int
	}{
		{`{"card":{"number":"4111111111111111","exp":"12/30"},"amount":12.50}`, `{"card":{"number":"****","exp":"12/30"},"amount":12.50}`, 1},
		{`{"customer":{"a":{"iban":"DE89"},"b":{"iban":"FR76","name":"x"}}}`, `{"customer":{"a":{"iban":"****"},"b":{"iban":"****","name":"x"}}}`, 2},
		{`{"items":[{"pan":"1"},{"pan":2},{"sku":"s"}]}`, `{"items":[{"pan":"****"},{"pan":"****"},{"sku":"s"}]}`, 2},
		{`{"secret":{"deep":[1,2,{"x":3}]},"z":null}`, `{"secret":"****","z":null}`, 1},
		{`{"b":1,"a":"<script>\u00e9"}`, `{"b":1,"a":"<script>é"}`, 0},
		{`[1,2]`, `[1,2]`, 0},
	} {
		got, n, err := m.apply([]byte(tc.in))
		if err != nil || string(got) != tc.want || n != tc.n {
			t.Errorf("apply(%s) = %s, %d, %v; want %s, %d", tc.in, got, n, err, tc.want, tc.n)
		}
	}
	for _, bad := range []string{``, `{"a":`, `{"a":1} trailing`, "\xff", `hello`} {
		if _, _, err := m.apply([]byte(bad)); !errors.Is(err, errNotJSON) {
			t.Errorf("apply(%q): %v, want errNotJSON", bad, err)
		}
	}
	for _, bad := range []string{"", "$.", "a..b", "."} {
		if _, err := parseMaskPath(bad); err == nil {
			t.Errorf("parseMaskPath(%q): no error", bad)
		}
	}
}

func TestShowBytes(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                     "plain",
		"a\xffb":                    `a\xffb`,
		"tab\tnl\n":                 "tab\tnl\n",
		"bell\x07":                  `bell\x07`,
		"rtl\u202eoverride":         `rtl\u202eoverride`,
		"<script>alert(1)</script>": "<script>alert(1)</script>",
	} {
		if got := showBytes([]byte(in)); got != want {
			t.Errorf("showBytes(%q) = %q, want %q", in, got, want)
		}
	}
}

package mask

import (
	"errors"
	"testing"
)

func TestPayload(t *testing.T) {
	m, err := New([]string{"card.number", "$.customer.*.iban", "items.*.pan", "secret"})
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
		got, n, err := m.Payload([]byte(tc.in), nil)
		if err != nil || string(got) != tc.want || n != tc.n {
			t.Errorf("Payload(%s) = %s, %d, %v; want %s, %d", tc.in, got, n, err, tc.want, tc.n)
		}
	}
	for _, bad := range []string{``, `{"a":`, `{"a":1} trailing`, "\xff", `hello`} {
		if _, _, err := m.Payload([]byte(bad), nil); !errors.Is(err, ErrNotJSON) {
			t.Errorf("Payload(%q): %v, want ErrNotJSON", bad, err)
		}
	}
	for _, bad := range []string{"", "$.", "a..b", "."} {
		if err := ParsePath(bad); err == nil {
			t.Errorf("ParsePath(%q): no error", bad)
		}
	}
}

// TestPayloadScrubsOtherFields: a masked value, or a card number, written
// into another field of the same payload is masked there too.
func TestPayloadScrubsOtherFields(t *testing.T) {
	m, _ := New([]string{"card.number", "customer.email"})
	v := []byte(`{"card":{"number":"4111111111111111"},"customer":{"email":"ann@example.com"},"note":"for ann@example.com, card 5500-0000-0000-0004","n":7}`)
	got, n, err := m.Payload(v, m.For(v))
	want := `{"card":{"number":"****"},"customer":{"email":"****"},"note":"for ****, card ****","n":7}`
	if err != nil || string(got) != want || n != 3 {
		t.Errorf("Payload = %s, %d, %v; want %s, 3", got, n, err, want)
	}
}

func TestScrubber(t *testing.T) {
	m, _ := New([]string{"card.number", "customer.*", "cvv", "account"})
	sc := m.For(
		[]byte(`{"card":{"number":4111111111111111},"customer":{"email":"ann@example.com","name":"Ann Lee"},"cvv":"123","account":"1234"}`),
		[]byte(`{"customer":{"email":"bob@example.com"}}`), // an edited version
		[]byte(`not json`),
	)
	for in, want := range map[string]string{
		"charge 4111111111111111 for ann@example.com: declined": "charge **** for ****: declined",
		"main.charge({0x4111111111111111})":                     "main.charge({0x****})",
		"customer Ann Lee, then bob@example.com":                "customer ****, then ****",
		"card 4111 1111 1111 1111 and 5500-0000-0000-0004":      "card **** and ****",
		"cvv 123 stays (too short), account 1234 goes":          "cvv 123 stays (too short), account **** goes",
		"offset 12345 and 912340 keep their digits, a1234b not": "offset 12345 and 912340 keep their digits, a****b not",
		"4111111111111112 fails the Luhn check":                 "4111111111111112 fails the Luhn check",
		"20 digits 41111111111111111110 are no card":            "20 digits 41111111111111111110 are no card",
		"12 digits 411111111116 are too few":                    "12 digits 411111111116 are too few",
		"two  spaces 4111  1111 1111 1111 break the run":        "two  spaces 4111  1111 1111 1111 break the run",
		"": "",
	} {
		if got := sc.String(in); got != want {
			t.Errorf("String(%q) = %q, want %q", in, got, want)
		}
	}
	if got := string(sc.Bytes([]byte("x 4111111111111111"))); got != "x ****" {
		t.Errorf("Bytes: %q", got)
	}
	// Inactive: nothing changes, not even card numbers.
	off, _ := New(nil)
	if sc := off.For([]byte(`{"a":1}`)); sc != nil || sc.String("4111111111111111") != "4111111111111111" {
		t.Errorf("inactive masker scrubs")
	}
}

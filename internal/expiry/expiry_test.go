package expiry_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/expiry"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func deadline(v string) []handler.Header {
	return []handler.Header{{Key: "idempotency-key", Value: []byte("k")}, {Key: expiry.HeaderDeadline, Value: []byte(v)}}
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

func TestCheck(t *testing.T) {
	tests := []struct {
		name    string
		ts      time.Time
		headers []handler.Header
		maxAge  time.Duration
		want    expiry.Status
		reason  string // a part of Reason
	}{
		{name: "no limit, no header", ts: now.Add(-1000 * time.Hour), want: expiry.Live},
		{name: "young", ts: now.Add(-time.Minute), maxAge: time.Hour, want: expiry.Live},
		{name: "exactly max age", ts: now.Add(-time.Hour), maxAge: time.Hour, want: expiry.Live},
		{name: "just over max age", ts: now.Add(-time.Hour - time.Millisecond), maxAge: time.Hour, want: expiry.Expired,
			reason: "is 1h0m0.001s old, over the max age 1h0m0s"},
		{name: "three days old", ts: now.Add(-72 * time.Hour), maxAge: 24 * time.Hour, want: expiry.Expired, reason: "72h0m0s old"},
		{name: "no timestamp never expires by age", maxAge: time.Second, want: expiry.Live},
		{name: "timestamp in the future", ts: now.Add(time.Hour), maxAge: time.Second, want: expiry.Live},
		{name: "deadline ahead (ms)", ts: now, headers: deadline(ms(now.Add(time.Second))), want: expiry.Live},
		{name: "deadline now is not past", ts: now, headers: deadline(ms(now)), want: expiry.Live},
		{name: "deadline passed (ms)", ts: now, headers: deadline(ms(now.Add(-time.Millisecond))), want: expiry.Expired,
			reason: "passed 1ms before"},
		{name: "deadline passed (RFC 3339)", ts: now, headers: deadline("2026-12-01T11:00:00Z"), want: expiry.Expired,
			reason: "deadline 2026-12-01T11:00:00Z (header idem-deadline) passed 1h0m0s"},
		{name: "deadline ahead (RFC 3339 with offset)", ts: now, headers: deadline("2026-12-01T13:30:00+01:00"), want: expiry.Live},
		{name: "deadline ahead but too old", ts: now.Add(-2 * time.Hour), maxAge: time.Hour,
			headers: deadline(ms(now.Add(time.Hour))), want: expiry.Expired, reason: "over the max age"},
		{name: "deadline passed, young", ts: now, maxAge: time.Hour, headers: deadline(ms(now.Add(-time.Hour))), want: expiry.Expired,
			reason: "deadline"},
		{name: "invalid header wins over age", ts: now.Add(-2 * time.Hour), maxAge: time.Hour, headers: deadline("tomorrow"),
			want: expiry.InvalidHeader, reason: `header idem-deadline: "tomorrow" is not a time`},
		{name: "empty header", ts: now, headers: deadline(""), want: expiry.InvalidHeader, reason: "empty value"},
		{name: "seconds with a fraction", ts: now, headers: deadline("1767225600.5"), want: expiry.InvalidHeader},
		{name: "negative ms", ts: now, headers: deadline("-5"), want: expiry.InvalidHeader},
		{name: "spaces", ts: now, headers: deadline(" 1767225600000"), want: expiry.InvalidHeader},
		{name: "date only", ts: now, headers: deadline("2026-12-02"), want: expiry.InvalidHeader},
		{name: "no zone", ts: now, headers: deadline("2026-12-02T00:00:00"), want: expiry.InvalidHeader},
		{name: "ms beyond year 9999", ts: now, headers: deadline("999999999999999999"), want: expiry.InvalidHeader, reason: "after year 9999"},
		{name: "ms overflowing int64", ts: now, headers: deadline("99999999999999999999999"), want: expiry.InvalidHeader},
		{name: "last header counts", ts: now, headers: append(deadline("garbage"), handler.Header{Key: expiry.HeaderDeadline, Value: []byte(ms(now.Add(time.Hour)))}),
			want: expiry.Live},
		{name: "long garbage is quoted short", ts: now, headers: deadline(strings.Repeat("é", 100)), want: expiry.InvalidHeader,
			reason: "… (200 bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := expiry.Check(tt.ts, tt.headers, expiry.HeaderDeadline, tt.maxAge, now)
			if got.Status != tt.want || !strings.Contains(got.Reason, tt.reason) {
				t.Fatalf("Check = %v %q; want %v with reason containing %q", got.Status, got.Reason, tt.want, tt.reason)
			}
			if (got.Status == expiry.Live) != (got.Reason == "") {
				t.Fatalf("Live must have no reason and the others one: %v %q", got.Status, got.Reason)
			}
		})
	}
}

func TestPolicy(t *testing.T) {
	p := expiry.Policy{MaxAge: time.Hour, MaxAgeByTopic: map[string]time.Duration{"audit": 0, "quotes": time.Minute}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	old := now.Add(-2 * time.Minute)
	for topic, want := range map[string]expiry.Status{"payments": expiry.Live, "quotes": expiry.Expired, "audit": expiry.Live} {
		if got := p.Check(topic, old, nil, now).Status; got != want {
			t.Errorf("topic %s, 2m old: %v, want %v", topic, got, want)
		}
	}
	if got := p.Check("audit", now.Add(-1000*time.Hour), nil, now).Status; got != expiry.Live {
		t.Errorf("audit (no limit), 1000h old: %v", got)
	}
	custom := expiry.Policy{Header: "x-expires"}
	h := []handler.Header{{Key: "x-expires", Value: []byte("nope")}, {Key: expiry.HeaderDeadline, Value: []byte("also nope")}}
	if r := custom.Check("t", now, h, now); r.Status != expiry.InvalidHeader || !strings.Contains(r.Reason, "x-expires") {
		t.Errorf("custom header: %v %q", r.Status, r.Reason)
	}
	if r := (expiry.Policy{}).Check("t", now, h[1:], now); r.Status != expiry.InvalidHeader {
		t.Errorf("the zero Policy reads idem-deadline: %v", r.Status)
	}
	if r := expiry.Check(now, h, "", 0, now); r.Status != expiry.Live {
		t.Errorf("an empty header name checks no header: %v", r.Status)
	}
	if r := (expiry.Policy{}).Check("t", now, deadline(ms(now.Add(time.Hour))), now); !r.Deadline.Equal(now.Add(time.Hour)) {
		t.Errorf("Deadline = %v", r.Deadline)
	}
	for s, want := range map[expiry.Status]string{expiry.Live: "live", expiry.Expired: "expired", expiry.InvalidHeader: "invalid-header", 9: "Status(9)"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", s, s.String(), want)
		}
	}
}

// TestPolicyValidate (issue 21, test 7): bad values are an error naming the
// field and the value.
func TestPolicyValidate(t *testing.T) {
	tests := []struct {
		name string
		p    expiry.Policy
		want string
	}{
		{"negative age", expiry.Policy{MaxAge: -time.Second}, "MaxAge = -1s: must be >= 0"},
		{"negative topic age", expiry.Policy{MaxAgeByTopic: map[string]time.Duration{"payments": -time.Minute}}, `MaxAgeByTopic["payments"] = -1m0s`},
		{"empty topic", expiry.Policy{MaxAgeByTopic: map[string]time.Duration{"": time.Minute}}, "empty topic name"},
		{"NUL in header", expiry.Policy{Header: "a\x00b"}, "Header"},
		{"bad UTF-8 header", expiry.Policy{Header: "\xff"}, "Header"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if !errors.Is(err, expiry.ErrInvalidPolicy) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate = %v; want ErrInvalidPolicy saying %q", err, tt.want)
			}
		})
	}
	if err := (expiry.Policy{}).Validate(); err != nil {
		t.Fatalf("the zero Policy: %v", err)
	}
}

// FuzzParseDeadline: no input panics; what parses round-trips through unix
// milliseconds or RFC 3339; any digit string up to year 9999 parses; an
// error quotes at most about 64 bytes of the value.
func FuzzParseDeadline(f *testing.F) {
	for _, s := range []string{"0", "1767225600000", "253402300799999", "253402300800000", "-1", "", " 1",
		"2026-12-01T11:00:00Z", "2026-12-01T13:30:00.123456789+01:00", "2026-12-01", "tomorrow", "1e3", "\xff\xfe", "٣"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		d, err := expiry.ParseDeadline(v)
		digits := len(v) > 0 && strings.Trim(string(v), "0123456789") == ""
		if err != nil {
			if len(err.Error()) > 400 {
				t.Fatalf("error of %d bytes for a %d-byte value", len(err.Error()), len(v))
			}
			if digits && len(v) < 15 {
				t.Fatalf("%q: digits within range refused: %v", v, err)
			}
			return
		}
		if d.Year() > 9999 || d.IsZero() && string(v) != "" && !digits {
			t.Fatalf("%q parsed to %v", v, d)
		}
		if digits {
			back, err := expiry.ParseDeadline([]byte(strconv.FormatInt(d.UnixMilli(), 10)))
			if err != nil || !back.Equal(d) {
				t.Fatalf("%q: %v does not round-trip as ms: %v %v", v, d, back, err)
			}
			return
		}
		back, err := expiry.ParseDeadline([]byte(d.Format(time.RFC3339Nano)))
		if err != nil || !back.Equal(d) {
			t.Fatalf("%q: %v does not round-trip as RFC 3339: %v %v", v, d, back, err)
		}
	})
}

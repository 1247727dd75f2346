package consumer

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
)

func orderKey(m *handler.Message) (string, error) { return string(m.Key), nil }

func TestKeyFuncString(t *testing.T) {
	cases := []struct {
		f    KeyFunc
		want string
	}{
		{HeaderKey("idempotency-key"), "consumer.HeaderKey"},
		{RecordKey(), "consumer.RecordKey"},
		{JSONField("id"), "consumer.JSONField"},
		{FirstOf(RecordKey()), "consumer.FirstOf"},
		{orderKey, "consumer.orderKey"},
		{func(*handler.Message) (string, error) { return "", nil }, "func literal in consumer.TestKeyFuncString"},
		{nil, "<nil>"},
	}
	for _, c := range cases {
		if got := c.f.String(); got != c.want {
			t.Errorf("String() = %q, want %q", got, c.want)
		}
	}
}

// TestKeyWatchWarnsOnceAfterSample: keySample distinct records without a
// key trigger exactly one warning; a record seen twice counts once; a topic
// whose first record has a key never warns.
func TestKeyWatchWarnsOnceAfterSample(t *testing.T) {
	var w keyWatch
	missing := errors.New("no key")
	warned := 0
	for i := range keySample - 1 {
		for range 2 { // looked at twice (a batch's prepare, then handle): counts once
			if w.observe("t", int32(i%3), int64(i), missing) {
				warned++
			}
		}
	}
	if warned != 0 {
		t.Fatalf("warned after %d records, want after %d", keySample-1, keySample)
	}
	for i := keySample - 1; i < 3*keySample; i++ {
		if w.observe("t", 0, int64(100+i), missing) {
			warned++
		}
	}
	if warned != 1 {
		t.Fatalf("warned %d times, want once", warned)
	}
	if w.observe("u", 0, 0, nil) {
		t.Fatal("a record with a key warned")
	}
	for i := range 2 * keySample {
		if w.observe("u", 0, int64(i+1), missing) {
			t.Fatal("topic u warned although its first record had a key")
		}
	}
}

func TestKeyWatchIsSafeForConcurrentUse(t *testing.T) {
	var w keyWatch
	done := make(chan int)
	for p := range 4 {
		go func() {
			n := 0
			for i := range 50 {
				if w.observe("t", int32(p), int64(i), errors.New("none")) {
					n++
				}
			}
			done <- n
		}()
	}
	total := 0
	for range 4 {
		total += <-done
	}
	if total != 1 {
		t.Fatalf("%d warnings, want 1", total)
	}
}

func TestExtractors(t *testing.T) {
	val := func(s string) *handler.Message { return &handler.Message{Value: []byte(s)} }
	hdr := func(k, v string) *handler.Message {
		return &handler.Message{Headers: []handler.Header{{Key: k, Value: []byte(v)}}}
	}
	cases := []struct {
		name    string
		f       KeyFunc
		m       *handler.Message
		want    string
		wantErr string // substring of the error; "" means no error
	}{
		{"header", HeaderKey("idempotency-key"), hdr("idempotency-key", "k1"), "k1", ""},
		{"header absent", HeaderKey("idempotency-key"), hdr("other", "x"), "", `HeaderKey("idempotency-key"): no header`},
		{"header empty", HeaderKey("idempotency-key"), hdr("idempotency-key", ""), "", "is empty"},
		{"record key", RecordKey(), &handler.Message{Key: []byte("evt-1")}, "evt-1", ""},
		{"record key null", RecordKey(), &handler.Message{}, "", "RecordKey(): the record has no key"},
		{"json string", JSONField("id"), val(`{"id":"o-1","n":2}`), "o-1", ""},
		{"json nested", JSONField("meta.event_id"), val(`{"meta":{"event_id":"e-9"}}`), "e-9", ""},
		{"json number kept as written", JSONField("id"), val(`{"id": 1.50e3 }`), "1.50e3", ""},
		{"json negative int", JSONField("a.b"), val(`{"a":{"b":-42}}`), "-42", ""},
		{"json escaped string", JSONField("id"), val(`{"id":"a\u00e9\"b"}`), "aé\"b", ""},
		{"json missing", JSONField("meta.event_id"), val(`{"meta":{}}`), "", `JSONField("meta.event_id"): no field "meta.event_id"`},
		{"json missing parent", JSONField("meta.event_id"), val(`{"id":1}`), "", `no field "meta"`},
		{"json parent not object", JSONField("meta.event_id"), val(`{"meta":"x"}`), "", `"meta" is not a JSON object`},
		{"json not object", JSONField("id"), val(`[1,2]`), "", "the value is not a JSON object"},
		{"json garbage", JSONField("id"), val(`{"id":`), "", "the value is not valid JSON"},
		{"json not json", JSONField("id"), val(`order-1`), "", "the value is not valid JSON"},
		{"json string value", JSONField("id"), val(`"id"`), "", "the value is not a JSON object"},
		{"json null", JSONField("id"), val(`{"id":null}`), "", "the field is null"},
		{"json bool", JSONField("id"), val(`{"id":true}`), "", "a boolean"},
		{"json object", JSONField("id"), val(`{"id":{}}`), "", "an object"},
		{"json array", JSONField("id"), val(`{"id":[]}`), "", "an array"},
		{"json empty string", JSONField("id"), val(`{"id":""}`), "", "empty string"},
		{"json bad path", JSONField("a..b"), val(`{}`), "", "invalid path"},
		{"json empty path", JSONField(""), val(`{}`), "", "invalid path"},
		{"first of: second", FirstOf(HeaderKey("idempotency-key"), JSONField("id")), val(`{"id":"j"}`), "j", ""},
		{"first of: first wins", FirstOf(RecordKey(), JSONField("id")), &handler.Message{Key: []byte("r"), Value: []byte(`{"id":"j"}`)}, "r", ""},
		{"first of: none", FirstOf(RecordKey(), JSONField("id")), val(`{}`), "", `FirstOf: no key found (RecordKey(): the record has no key; JSONField("id"): no field "id")`},
		{"first of: empty", FirstOf(), val(`{}`), "", "FirstOf: no key found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.f(c.m)
			if c.wantErr == "" {
				if err != nil || got != c.want {
					t.Fatalf("= %q, %v; want %q", got, err, c.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) || got != "" {
				t.Fatalf("= %q, %v; want an error containing %q", got, err, c.wantErr)
			}
		})
	}
}

// FuzzJSONField: any value gives either a non-empty key or an error, never
// a panic, and a string field round-trips.
func FuzzJSONField(f *testing.F) {
	f.Add([]byte(`{"a":{"b":"x"}}`), "a.b")
	f.Add([]byte(`{"a":1e400}`), "a")
	f.Add([]byte("\xff"), "a")
	f.Fuzz(func(t *testing.T, value []byte, path string) {
		k, err := JSONField(path)(&handler.Message{Value: value})
		if (err == nil) == (k == "") {
			t.Fatalf("key %q with error %v", k, err)
		}
		if err != nil && !strings.Contains(err.Error(), fmt.Sprintf("JSONField(%q)", path)) {
			t.Fatalf("error %v does not name the extractor", err)
		}
	})
}

// TestWarnIgnoredInitial: a base sarama config asking for the oldest offset
// while StartAt says newest is named in a WARN, not silently overridden.
func TestWarnIgnoredInitial(t *testing.T) {
	for _, c := range []struct {
		initial int64
		start   StartPosition
		warn    bool
	}{
		{sarama.OffsetOldest, StartNewest, true},
		{sarama.OffsetOldest, StartOldest, false},
		{sarama.OffsetNewest, StartNewest, false},
		{sarama.OffsetNewest, StartOldest, false}, // sarama's default: cannot tell it was meant
	} {
		var buf strings.Builder
		cfg := defaults()
		cfg.Sarama = sarama.NewConfig()
		cfg.Sarama.Consumer.Offsets.Initial = c.initial
		cfg.StartAt = c.start
		s := setup{cfg: cfg, log: slog.New(slog.NewTextHandler(&buf, nil))}
		s.warnIgnoredInitial()
		if got := strings.Contains(buf.String(), "idem uses StartAt"); got != c.warn {
			t.Errorf("Initial %d, StartAt %s: warned %v, want %v (%s)", c.initial, c.start, got, c.warn, buf.String())
		}
	}
}

// BenchmarkKeyExtractors: the cost of each extractor per message, with a
// 200-byte JSON value (the JSONField figure backs its doc's "cheap next to a
// database round trip").
func BenchmarkKeyExtractors(b *testing.B) {
	m := &handler.Message{
		Key:     []byte("acct-42"),
		Value:   []byte(`{"meta":{"event_id":"4b1f0c2e-9d6a-4f1e-8a53-2f7c9b1d0e11","source":"checkout"},"order_id":"o-123456","amount_cents":1999,"currency":"EUR","items":[{"sku":"a","qty":1}]}`),
		Headers: []handler.Header{{Key: "traceparent", Value: []byte("00-abc-def-01")}, {Key: "idempotency-key", Value: []byte("k-1")}},
	}
	for _, c := range []struct {
		name string
		f    KeyFunc
	}{
		{"HeaderKey", HeaderKey("idempotency-key")},
		{"RecordKey", RecordKey()},
		{"JSONField", JSONField("meta.event_id")},
		{"FirstOf-miss-then-JSON", FirstOf(HeaderKey("x-event-id"), JSONField("meta.event_id"))},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if k, err := c.f(m); err != nil || k == "" {
					b.Fatal(k, err)
				}
			}
		})
	}
}

package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
)

func TestClassify(t *testing.T) {
	pg := func(code string) error { return &pgconn.PgError{Code: code, Message: "x"} }
	store := func(op string, err error) error { return &dedupe.StoreError{Op: op, Err: err} }
	for _, c := range []struct {
		name        string
		err         error
		retryPanics bool
		want        class
		kind        handler.Kind // of the error classify returns, when forwarded
	}{
		{"nil", nil, false, classDone, ""},
		{"plain handler error", errors.New("boom"), false, classRetriable, handler.KindRetriable},
		{"timeout", fmt.Errorf("x: %w", handler.ErrTimeout), false, classRetriable, handler.KindTimeout},
		{"permanent", handler.Permanent(errors.New("no")), false, classPermanent, handler.KindPermanent},
		{"decode", handler.Decode(errors.New("bad json")), false, classPermanent, handler.KindDecode},
		{"missing key", &handler.MissingKeyError{Reason: "empty"}, false, classPermanent, handler.KindMissingKey},
		{"invalid key", &handler.MissingKeyError{Reason: "NUL", Invalid: true}, false, classPermanent, handler.KindInvalidKey},
		{"panic", &handler.PanicError{Value: "x"}, false, classPermanent, handler.KindPanic},
		{"panic retried", &handler.PanicError{Value: "x"}, true, classRetriable, handler.KindPanic},
		{"breaker open", &breaker.OpenError{Name: "bank"}, false, classBreaker, ""},
		{"store begin: conn refused", store("begin", io.ErrUnexpectedEOF), false, classOutage, ""},
		{"store commit: ambiguous", store("commit", io.EOF), false, classOutage, ""},
		{"lease held elsewhere", store("claim", dedupe.ErrInProgress), false, classOutage, ""},
		{"handler conn died", store("handler", errors.New("conn closed")), false, classOutage, ""},
		{"insert: invalid UTF-8 (22021)", store("insert", pg("22021")), false, classPermanent, handler.KindPermanent},
		{"handler: bad input syntax (22P02)", pg("22P02"), false, classPermanent, handler.KindPermanent},
		{"handler: program limit (54000)", fmt.Errorf("wrapped: %w", pg("54000")), false, classPermanent, handler.KindPermanent},
		{"commit: deferred unique (23505)", store("commit", pg("23505")), false, classRetriable, handler.KindRetriable},
		{"commit: serialization (40001)", store("commit", pg("40001")), false, classRetriable, handler.KindRetriable},
		{"insert: inbox table missing (42P01)", store("insert", pg("42P01")), false, classOutage, ""},
		{"insert: read-only after failover (25006)", store("insert", pg("25006")), false, classOutage, ""},
		{"handler: read-only after failover (25006)", pg("25006"), false, classOutage, ""},
		{"handler conn died with SQLSTATE 57P01", store("handler", pg("57P01")), false, classOutage, ""},
		{"handler: fk (23503)", pg("23503"), false, classRetriable, handler.KindRetriable},
		{"handler: serialization (40001)", pg("40001"), false, classRetriable, handler.KindRetriable},
		{"handler: undefined table (42P01)", pg("42P01"), false, classRetriable, handler.KindRetriable},
		{"handler: admin shutdown (57P01)", pg("57P01"), false, classOutage, ""},
		{"handler: connection failure (08006)", pg("08006"), false, classOutage, ""},
		{"handler: too many connections (53300)", pg("53300"), false, classOutage, ""},
		{"handler: out of memory (53200)", pg("53200"), false, classRetriable, handler.KindRetriable},
		{"handler: query cancelled (57014)", pg("57014"), false, classRetriable, handler.KindRetriable},
		{"handler says permanent over SQL", handler.Permanent(pg("08006")), false, classPermanent, handler.KindPermanent},
		// Issue 18 #14: the connection died under a handler (or a batch's
		// handler) that failed for good: permanent, as for a single message.
		{"conn died, handler said permanent", store("handler", handler.Permanent(errors.New("no"))), false, classPermanent, handler.KindPermanent},
		{"conn died, handler said decode", store("handler", handler.Decode(errors.New("bad json"))), false, classPermanent, handler.KindDecode},
		// Issue 18 #14: a store configuration error never heals: fatal.
		{"store config", store("config", errors.New("empty table name")), false, classFatal, ""},
		{"ctx cancelled", context.Canceled, false, classRetriable, handler.KindRetriable},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &runner{cfg: Config{Retry: RetryConfig{Panics: c.retryPanics}}}
			got, err := r.classify(c.err)
			if got != c.want {
				t.Fatalf("classify(%v) = %v, want %v", c.err, got, c.want)
			}
			if (c.err == nil) != (err == nil) || (c.err != nil && !errors.Is(err, c.err)) {
				t.Errorf("classify returned %v, want %v or a wrapper of it", err, c.err)
			}
			if c.kind != "" {
				if k := handler.ErrorKind(err); k != c.kind {
					t.Errorf("kind %q, want %q", k, c.kind)
				}
			}
		})
	}
}

func TestCheckKey(t *testing.T) {
	for _, c := range []struct {
		key     string
		ok      bool
		invalid bool
	}{
		{"order-1", true, false},
		{"", false, false},
		{strings.Repeat("k", 256), true, false},
		{strings.Repeat("k", 257), false, true},
		{"bad-\xff", false, true},
		{"nul\x00", false, true},
		{"émoji-✓", true, false},
	} {
		err := checkKey(c.key, 256)
		var mk *handler.MissingKeyError
		switch {
		case c.ok && err != nil:
			t.Errorf("checkKey(%q) = %v, want ok", c.key, err)
		case !c.ok && !errors.As(err, &mk):
			t.Errorf("checkKey(%q) = %v, want a *MissingKeyError", c.key, err)
		case !c.ok && mk.Invalid != c.invalid:
			t.Errorf("checkKey(%q).Invalid = %v, want %v", c.key, mk.Invalid, c.invalid)
		}
	}
}

// checkKey's one scan, eight bytes at a time, gives the two scans' answer
// (UTF-8 first, then NUL) for a NUL, an invalid byte or a multi-byte rune at
// every position of keys around the word size, and for both at once.
func TestCheckKeyOneScan(t *testing.T) {
	want := func(k string) string {
		switch {
		case !utf8.ValidString(k):
			return "not valid UTF-8"
		case strings.IndexByte(k, 0) >= 0:
			return "contains a NUL byte"
		}
		return ""
	}
	for n := 1; n <= 25; n++ {
		for i := range n {
			for _, bad := range []string{"\x00", "\xff", "\x80", "é", "✓", "\xe2\x9c", "\x7f", "\x01"} {
				for _, also := range []string{"", "\x00", "\xff"} {
					k := strings.Repeat("k", i) + bad + strings.Repeat("k", n-i-1) + also
					got := ""
					var mk *handler.MissingKeyError
					if err := checkKey(k, 256); errors.As(err, &mk) {
						got = mk.Reason
					} else if err != nil {
						t.Fatal(err)
					}
					if got != want(k) {
						t.Fatalf("checkKey(%q) = %q, want %q", k, got, want(k))
					}
				}
			}
		}
	}
}

// FuzzKeyExtraction feeds arbitrary header bytes through the default key
// extractor and the key check: they never panic, and a key they accept is
// one PostgreSQL's text type stores (valid UTF-8, no NUL) within the limit.
func FuzzKeyExtraction(f *testing.F) {
	f.Add([]byte("idempotency-key"), []byte("order-1"))
	f.Add([]byte("idempotency-key"), []byte("bad-\xff\xfe"))
	f.Add([]byte("idempotency-key"), []byte("nul\x00key"))
	f.Add([]byte("idempotency-key"), []byte{})
	f.Add([]byte("\xffidempotency-key"), []byte("x"))
	f.Fuzz(func(t *testing.T, name, value []byte) {
		m := &handler.Message{Headers: []handler.Header{{Key: string(name), Value: value}}}
		k, err := callKeyFunc(HeaderKey("idempotency-key"), m)
		if (err != nil) != (k == "") { // an absent or empty header is an error naming it
			t.Fatalf("HeaderKey = %q, %v", k, err)
		}
		if err := checkKey(k, 256); err == nil {
			if k == "" || len(k) > 256 || !utf8.ValidString(k) || strings.IndexByte(k, 0) >= 0 {
				t.Fatalf("checkKey accepted %q", k)
			}
		}
		// A KeyFunc that panics on bad input is an error, never a crash.
		if _, err := callKeyFunc(func(m *handler.Message) (string, error) { panic(string(value)) }, m); err == nil {
			t.Fatal("a panicking KeyFunc gave no error")
		}
	})
}

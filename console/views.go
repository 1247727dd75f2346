package console

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/mask"
)

// listErrorBytes caps the error text of each record in a list.
const listErrorBytes = 1024

// parseFilter reads a Filter from query or form values: group, topic, kind,
// fingerprint, key, error (substring), status (comma-separated or repeated),
// since and until (RFC 3339, or the browser's 2006-01-02T15:04 in UTC).
func parseFilter(v url.Values) (failidx.Filter, error) {
	f := failidx.Filter{
		Group:         strings.TrimSpace(v.Get("group")),
		Topic:         strings.TrimSpace(v.Get("topic")),
		Kind:          strings.TrimSpace(v.Get("kind")),
		Fingerprint:   strings.TrimSpace(v.Get("fingerprint")),
		Key:           v.Get("key"),
		ErrorContains: v.Get("error"),
	}
	for _, s := range v["status"] {
		for _, st := range strings.Split(s, ",") {
			if st = strings.TrimSpace(st); st == "" || st == "any" {
				continue
			}
			switch failidx.Status(st) {
			case failidx.Unresolved, failidx.Replaying, failidx.Replayed, failidx.Resolved, failidx.Archived:
				f.Status = append(f.Status, failidx.Status(st))
			default:
				return f, badInput("status", "status %q: want unresolved, replaying, replayed, resolved or archived", st)
			}
		}
	}
	var err error
	if f.Since, err = parseTime(v.Get("since")); err != nil {
		return f, badInput("since", "since: %v", err)
	}
	if f.Until, err = parseTime(v.Get("until")); err != nil {
		return f, badInput("until", "until: %v", err)
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && f.Until.Before(f.Since) {
		return f, badInput("until", "until (%s) is before since (%s)", f.Until.Format(time.RFC3339), f.Since.Format(time.RFC3339))
	}
	return f, nil
}

func parseTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time (RFC 3339, e.g. 2026-01-02T15:04:05Z)", s)
}

// filterValues is the inverse of parseFilter, for links.
func filterValues(f failidx.Filter) url.Values {
	v := url.Values{}
	set := func(k, s string) {
		if s != "" {
			v.Set(k, s)
		}
	}
	set("group", f.Group)
	set("topic", f.Topic)
	set("kind", f.Kind)
	set("fingerprint", f.Fingerprint)
	set("key", f.Key)
	set("error", f.ErrorContains)
	var st []string
	for _, s := range f.Status {
		st = append(st, string(s))
	}
	set("status", strings.Join(st, ","))
	if !f.Since.IsZero() {
		v.Set("since", f.Since.UTC().Format(time.RFC3339))
	}
	if !f.Until.IsZero() {
		v.Set("until", f.Until.UTC().Format(time.RFC3339))
	}
	return v
}

// parseLimit reads limit (default defaultPageSize, at most maxPageSize).
func parseLimit(s string) (int, error) {
	if s == "" {
		return defaultPageSize, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxPageSize {
		return 0, badInput("limit", "limit %q: want 1 to %d", s, maxPageSize)
	}
	return n, nil
}

// recordView is a record as the API returns it and the UI shows it.
type recordView struct {
	ID              int64          `json:"id"`
	Topic           string         `json:"topic"`
	Partition       int32          `json:"partition"`
	Offset          int64          `json:"offset"`
	OriginTopic     string         `json:"origin_topic"`
	OriginPartition int32          `json:"origin_partition"`
	OriginOffset    int64          `json:"origin_offset"`
	Group           string         `json:"group"`
	Fingerprint     string         `json:"fingerprint"`
	Kind            string         `json:"kind"`
	Key             string         `json:"key"`
	IdempotencyKey  string         `json:"idempotency_key"`
	Attempts        int            `json:"attempts"`
	FirstFailureAt  time.Time      `json:"first_failure_at,omitzero"`
	LastFailureAt   time.Time      `json:"last_failure_at,omitzero"`
	IndexedAt       time.Time      `json:"indexed_at,omitzero"`
	Error           string         `json:"error"`
	ErrorType       string         `json:"error_type,omitempty"`
	Stack           string         `json:"stack,omitempty"`
	Status          failidx.Status `json:"status"`
	StatusActor     string         `json:"status_actor,omitempty"`
	StatusReason    string         `json:"status_reason,omitempty"`
	StatusAt        time.Time      `json:"status_at,omitzero"`
	PreviousID      int64          `json:"previous_id,omitempty"`
	Stub            bool           `json:"stub"`
	ValueSize       int            `json:"value_size"`
	Value           *payloadView   `json:"value,omitempty"`
	Headers         []headerView   `json:"headers,omitempty"`
	Versions        []versionView  `json:"versions,omitempty"`
	ErrorCut        bool           `json:"-"`

	// KeyID is the data key that seals the payload at rest (0: in clear);
	// PayloadUnavailable says why it cannot be read ("key destroyed", …),
	// PayloadError how.
	KeyID              int64  `json:"key_id,omitempty"`
	PayloadUnavailable string `json:"payload_unavailable,omitempty"`
	PayloadError       string `json:"payload_error,omitempty"`
}

// payloadView is a value: masked unless revealed, as text when it is
// UTF-8 and as base64 otherwise.
type payloadView struct {
	Size      int    `json:"size"`      // bytes of the original record
	Stored    int    `json:"stored"`    // bytes the index kept
	Truncated bool   `json:"truncated"` // the index kept only a prefix
	JSON      bool   `json:"json"`
	Masked    int    `json:"masked_values"`
	Hidden    bool   `json:"hidden"` // masking is on and the value is not JSON
	Revealed  bool   `json:"revealed"`
	Text      string `json:"text,omitempty"`
	Base64    string `json:"base64,omitempty"`

	// Schema is the registry schema a value in a schema registry's wire
	// format was decoded with (Config.Registry), Decoded the value as JSON:
	// unmasked, Text or Base64 keep its bytes; masked, Text is the decoded
	// JSON, masked. DecodeError says why such a value did not decode.
	Schema      *schemaView `json:"schema,omitempty"`
	Decoded     string      `json:"decoded,omitempty"`
	DecodeError string      `json:"decode_error,omitempty"`

	raw        []byte // what may be shown (masked unless revealed)
	Display    string `json:"-"` // what the page shows, capped
	DisplayCut bool   `json:"-"` // Display is a prefix

	// Unavailable: the value cannot be read ("key destroyed", …).
	Unavailable string `json:"unavailable,omitempty"`
}

type headerView struct {
	Key        string `json:"key"`
	Value      string `json:"value"`
	Size       int    `json:"size"`
	Display    string `json:"-"`
	DisplayCut bool   `json:"-"`
}

type versionView struct {
	N                  int          `json:"n"`
	Actor              string       `json:"actor"`
	Reason             string       `json:"reason,omitempty"`
	At                 time.Time    `json:"at"`
	PublishedTo        string       `json:"published_to,omitempty"`
	PublishedPartition int32        `json:"published_partition"`
	PublishedOffset    int64        `json:"published_offset"`
	Value              *payloadView `json:"value"`
}

// listView is a record of a list: no payload, headers or stack; sc
// scrubs its error text and keys (nil: masking off).
func (s *server) listView(r failidx.Record, sc *mask.Scrubber) recordView {
	v := baseView(r, sc)
	v.Stack = ""
	if len(v.Error) > listErrorBytes {
		v.Error, v.ErrorCut = cutUTF8(v.Error, listErrorBytes), true
	}
	return v
}

// baseView is the record without payload, headers or versions, its free
// text scrubbed by sc (nil: as stored).
func baseView(r failidx.Record, sc *mask.Scrubber) recordView {
	return recordView{
		ID: r.ID, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
		OriginTopic: r.OriginTopic, OriginPartition: r.OriginPartition, OriginOffset: r.OriginOffset,
		Group: r.Group, Fingerprint: r.Fingerprint, Kind: r.Kind, Key: showBytes(sc.Bytes(r.Key)),
		IdempotencyKey: sc.String(r.IdempotencyKey), Attempts: r.Attempts,
		FirstFailureAt: r.FirstFailureAt, LastFailureAt: r.LastFailureAt, IndexedAt: r.IndexedAt,
		Error: validText(sc.String(r.Error)), ErrorType: sc.String(r.ErrorType), Stack: validText(sc.String(r.Stack)),
		Status: r.Status, StatusActor: r.StatusActor, StatusReason: sc.String(r.StatusReason), StatusAt: r.StatusAt,
		PreviousID: r.PreviousID, Stub: r.Stub, ValueSize: r.ValueSize, KeyID: r.KeyID,
	}
}

func validText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// scrubbers returns, when masking is on, the Scrubber of each record ids
// names: the values masked in its stored value, and card numbers. A record
// whose value cannot be read gets card numbers only. Off: nil.
func (s *server) scrubbers(ctx context.Context, ids []int64) (map[int64]*mask.Scrubber, error) {
	if !s.mask.Active() {
		return nil, nil
	}
	vals, err := s.store.Values(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]*mask.Scrubber, len(ids))
	for _, id := range ids {
		out[id] = s.mask.For(s.maskable(vals[id])...)
	}
	return out, nil
}

// detailView is a record with its payload (masked unless reveal), headers
// and versions; unless reveal, its free text loses the values masked in its
// payloads, and card numbers.
func (s *server) detailView(r failidx.Record, reveal bool) recordView {
	var sc *mask.Scrubber
	if !reveal {
		payloads := [][]byte{r.Value}
		for _, ver := range r.Versions {
			payloads = append(payloads, ver.Value)
		}
		sc = s.mask.For(s.maskable(payloads...)...)
	}
	v := baseView(r, sc)
	v.Value = s.payload(r.Value, r.ValueSize, r.ValueTruncated, reveal, sc)
	if r.PayloadErr != nil {
		v.PayloadUnavailable, v.PayloadError = failidx.Unavailable(r.PayloadErr), validText(sc.String(r.PayloadErr.Error()))
		v.Value = &payloadView{Size: r.ValueSize, Unavailable: v.PayloadUnavailable,
			Display: fmt.Sprintf("(%s: the value and headers of this record cannot be read)", v.PayloadUnavailable)}
	}
	for _, h := range r.Headers {
		hv := headerView{Key: showBytes(h.Key), Value: showBytes(sc.Header(string(h.Key), h.Value)), Size: len(h.Value)}
		hv.Display, hv.DisplayCut = s.display(hv.Value)
		v.Headers = append(v.Headers, hv)
	}
	for _, ver := range r.Versions {
		vv := versionView{
			N: ver.N, Actor: ver.Actor, Reason: sc.String(ver.Reason), At: ver.At, PublishedTo: ver.PublishedTo,
			PublishedPartition: ver.PublishedPartition, PublishedOffset: ver.PublishedOffset,
			Value: s.payload(ver.Value, len(ver.Value), false, reveal, sc),
		}
		if ver.PayloadErr != nil {
			vv.Value = &payloadView{Unavailable: failidx.Unavailable(ver.PayloadErr), Display: "(" + failidx.Unavailable(ver.PayloadErr) + ")"}
		}
		v.Versions = append(v.Versions, vv)
	}
	return v
}

// payload builds the view of a value: decoded to JSON when it is in a
// schema registry's wire format (Config.Registry), masked by Config.Mask
// unless reveal (the decoded fields; a value that is not JSON is then
// hidden whole; sc scrubs its other strings), then text or base64.
func (s *server) payload(val []byte, size int, truncated, reveal bool, sc *mask.Scrubber) *payloadView {
	p := &payloadView{Size: size, Stored: len(val), Truncated: truncated, Revealed: reveal && s.mask.Active()}
	dec, sch, derr := s.decodeValue(val)
	p.Schema = sch
	if derr != nil {
		p.DecodeError = validText(sc.String(derr.Error()))
	}
	p.JSON = json.Valid(val) || dec != nil
	shown := val
	if s.mask.Active() && !reveal {
		if dec != nil {
			val, dec = dec, nil // masked, the decoded JSON is all that is shown
		}
		masked, n, err := s.mask.Payload(val, sc)
		if err != nil {
			p.Hidden = true
			p.Display = fmt.Sprintf("(%d bytes, not JSON: hidden because masking is on; an operator may reveal it)", len(val))
			return p
		}
		shown, p.Masked = masked, n
	}
	p.raw = shown
	if utf8.Valid(shown) {
		p.Text = string(shown)
	} else {
		p.Base64 = base64.StdEncoding.EncodeToString(shown)
	}
	text := showBytes(shown)
	if dec != nil {
		p.Decoded = string(dec)
		shown = dec
	}
	if p.JSON {
		if pretty, err := indentJSON(shown); err == nil {
			text = showBytes(pretty)
		}
	}
	p.Display, p.DisplayCut = s.display(text)
	return p
}

func indentJSON(v []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := json.Indent(&buf, v, "", "  "); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// display caps s at Config.DisplayBytes on a rune boundary.
func (s *server) display(text string) (string, bool) {
	if len(text) <= s.cfg.DisplayBytes {
		return text, false
	}
	return cutUTF8(text, s.cfg.DisplayBytes), true
}

func cutUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// showBytes returns b as text when it is valid UTF-8, with control
// characters other than white space shown as \xNN; bytes that are not
// UTF-8 are shown as \xNN too. It never returns invalid UTF-8.
func showBytes(b []byte) string {
	var out strings.Builder
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && n <= 1:
			out.WriteString(`\x` + hex.EncodeToString(b[:1]))
		case r == '\n' || r == '\t' || r == '\r' || unicode.IsPrint(r) || r == ' ' || unicode.IsSpace(r):
			out.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&out, `\x%02x`, r)
		default:
			fmt.Fprintf(&out, `\u%04x`, r)
		}
		b = b[n:]
	}
	return out.String()
}

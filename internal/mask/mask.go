// Package mask is the hiding of sensitive values from whoever reads a dead letter: the
// failure console (UI and API) and `idem dlq` (list and show) use it, with the
// JSON paths an operator gives (console.Config.Mask, --mask).
//
// A Masker does two things:
//
//   - Payload replaces the values at the configured JSON paths of a payload
//     by "****" (an object or array as a whole), keeping everything else as
//     written;
//   - a Scrubber, built from the payloads of one record (For), replaces in
//     free text (the error, the stack, header values, the Kafka key, a
//     group's sample error, an outbox error, an audit row) every value it
//     masked in those payloads, and every card number: 13 to 19 digits,
//     spaces or dashes allowed between them, that pass the Luhn check.
//
// With no path configured a Masker is inactive and changes nothing.
package mask

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemhq/idem/internal/wire"
)

// Text replaces a masked value.
const Text = "****"

// minSecret is the shortest masked value a Scrubber looks for in free text:
// shorter ones ("1", "EU") would blank out unrelated words and digits.
const minSecret = 4

// path is one parsed mask path: object keys, "*" for any key or element.
type path []string

// ParsePath checks one mask path: dot-separated keys, "*" for any key or
// array element, an optional leading "$.".
func ParsePath(s string) error {
	_, err := parsePath(s)
	return err
}

func parsePath(s string) (path, error) {
	p := strings.TrimPrefix(strings.TrimSpace(s), "$.")
	if p == "" || p == "$" {
		return nil, fmt.Errorf("mask path %q is empty", s)
	}
	parts := strings.Split(p, ".")
	for _, part := range parts {
		if part == "" {
			return nil, fmt.Errorf("mask path %q has an empty segment", s)
		}
	}
	return parts, nil
}

// Masker masks payloads by JSON paths and scrubs free text. The zero value
// (and New(nil)) is inactive. It is safe for concurrent use.
type Masker struct{ paths []path }

// New parses paths (see ParsePath).
func New(paths []string) (*Masker, error) {
	m := &Masker{}
	for _, s := range paths {
		p, err := parsePath(s)
		if err != nil {
			return nil, err
		}
		m.paths = append(m.paths, p)
	}
	return m, nil
}

// Active reports whether any path is configured: masking is on.
func (m *Masker) Active() bool { return m != nil && len(m.paths) > 0 }

// match reports whether the value at p is masked: some configured path is a
// prefix of it (so masking an object masks all of it).
func (m *Masker) match(p []string) bool {
	if len(p) == 0 {
		return false
	}
	for _, mp := range m.paths {
		if len(mp) <= len(p) && slices.EqualFunc(mp, p[:len(mp)], func(a, b string) bool { return a == "*" || a == b }) {
			return true
		}
	}
	return false
}

// ErrNotJSON is returned by Payload for a payload that is not one JSON
// value: it cannot be masked (callers hide it whole).
var ErrNotJSON = errors.New("payload is not JSON")

// Payload returns v with every value at a masked path replaced by "****",
// keeping the order of object keys and every other value as written, and
// how many values it masked. When sc is not nil, every other string of v is
// scrubbed by it (a card number in a free-text field), each change counted.
// It returns ErrNotJSON when v is not one JSON value.
func (m *Masker) Payload(v []byte, sc *Scrubber) ([]byte, int, error) {
	var out bytes.Buffer
	n, err := m.walk(v, func(p []string, leaf any) (any, bool) {
		if m.match(p) {
			return Text, true
		}
		if s, ok := leaf.(string); ok && sc != nil {
			if c := sc.String(s); c != s {
				return c, true
			}
		}
		return leaf, false
	}, &out)
	if err != nil {
		return nil, 0, err
	}
	return out.Bytes(), n, nil
}

// secrets returns the text of every scalar at a masked path of v (strings
// as decoded, numbers as written), or nil when v is not JSON.
func (m *Masker) secrets(v []byte) []string {
	var out []string
	_, err := m.walk(v, func(p []string, leaf any) (any, bool) {
		if m.match(p) {
			switch x := leaf.(type) {
			case string:
				out = append(out, x)
			case json.Number:
				out = append(out, x.String())
			}
		}
		return leaf, false
	}, io.Discard)
	if err != nil {
		return nil
	}
	return out
}

// walk copies the JSON value v to out, calling f on every scalar with its
// path; f returns the scalar to write and whether it changed it. A masked
// object or array is written as one "****" (f sees its scalars, the output
// does not). It returns how many values were replaced.
func (m *Masker) walk(v []byte, f func(path []string, leaf any) (any, bool), out io.Writer) (int, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var buf bytes.Buffer
	n, err := m.value(dec, &buf, nil, f)
	if err != nil {
		return 0, ErrNotJSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return 0, ErrNotJSON
	}
	_, _ = out.Write(buf.Bytes())
	return n, nil
}

// value copies one JSON value from dec to out.
func (m *Masker) value(dec *json.Decoder, out *bytes.Buffer, p []string, f func([]string, any) (any, bool)) (int, error) {
	masked := m.match(p)
	tok, err := dec.Token()
	if err != nil {
		return 0, err
	}
	n := 0
	w := out
	if masked {
		w = &bytes.Buffer{} // read through, write nothing
	}
	switch t := tok.(type) {
	case json.Delim:
		if t != '{' && t != '[' {
			return 0, fmt.Errorf("unexpected %v", t)
		}
		w.WriteByte(byte(t))
		for i := 0; dec.More(); i++ {
			if i > 0 {
				w.WriteByte(',')
			}
			seg := strconv.Itoa(i)
			if t == '{' {
				kt, err := dec.Token()
				if err != nil {
					return 0, err
				}
				seg, _ = kt.(string)
				writeJSON(w, seg)
				w.WriteByte(':')
			}
			c, err := m.value(dec, w, append(p[:len(p):len(p)], seg), f)
			if err != nil {
				return 0, err
			}
			n += c
		}
		end, err := dec.Token()
		if err != nil {
			return 0, err
		}
		w.WriteByte(byte(end.(json.Delim)))
	default:
		leaf, changed := f(p, t)
		writeJSON(w, leaf)
		if changed && !masked {
			n++
		}
	}
	if masked {
		writeJSON(out, Text)
		return 1, nil
	}
	return n, nil
}

func writeJSON(out *bytes.Buffer, v any) {
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)           // strings, numbers, bools and nil always encode
	out.Truncate(out.Len() - 1) // Encode's newline
}

// Scrubber replaces masked values and card numbers in free text. A nil
// *Scrubber changes nothing.
type Scrubber struct {
	secrets []string // longest first
}

// For returns the Scrubber of one record: the values at masked paths of
// payloads (its value and edited versions; a payload that is not JSON adds
// none), and card numbers. It returns nil when m is inactive.
func (m *Masker) For(payloads ...[]byte) *Scrubber {
	if !m.Active() {
		return nil
	}
	sc := &Scrubber{}
	for _, p := range payloads {
		for _, s := range m.secrets(p) {
			if len(s) >= minSecret && !slices.Contains(sc.secrets, s) {
				sc.secrets = append(sc.secrets, s)
			}
		}
	}
	slices.SortFunc(sc.secrets, func(a, b string) int { return len(b) - len(a) })
	return sc
}

// String returns s with every masked value of the record and every card
// number replaced by "****". A masked value is replaced where it does not
// continue a run of its own kind: a value that starts with a digit is not
// looked for after a digit, one that starts with a letter not after a
// letter, and so on at its end (so the masked "1234" leaves "12345" alone,
// but "0x4111…" and "id=4111…" lose the number).
func (sc *Scrubber) String(s string) string {
	if sc == nil {
		return s
	}
	for _, sec := range sc.secrets {
		s = replaceWord(s, sec)
	}
	return CardNumbers(s)
}

// Header returns a header's value scrubbed as String does, except that
// idem's own numeric headers (attempt, tier, offsets, partitions, unix-ms
// times, sizes) are not searched for card numbers: a 13-digit millisecond
// time passes the Luhn check one time in ten.
func (sc *Scrubber) Header(key string, value []byte) []byte {
	if sc == nil {
		return value
	}
	if !numericHeaders[key] {
		return sc.Bytes(value)
	}
	s := string(value)
	for _, sec := range sc.secrets {
		s = replaceWord(s, sec)
	}
	if s == string(value) {
		return value
	}
	return []byte(s)
}

// numericHeaders are the idem-* headers whose values are numbers idem
// writes (internal/wire).
var numericHeaders = map[string]bool{
	wire.HeaderAttempt: true, wire.HeaderTier: true, wire.HeaderDueAt: true, wire.HeaderOriginalPartition: true,
	wire.HeaderOriginalOffset: true, wire.HeaderOriginalTimestamp: true, wire.HeaderFirstFailureAt: true,
	wire.HeaderLastFailureAt: true, wire.HeaderPayloadOmitted: true, wire.HeaderHeadersOmitted: true, wire.HeaderSchemaID: true,
}

// Bytes is String for bytes.
func (sc *Scrubber) Bytes(b []byte) []byte {
	if sc == nil {
		return b
	}
	s := sc.String(string(b))
	if s == string(b) {
		return b
	}
	return []byte(s)
}

// replaceWord replaces each occurrence of sec in s that does not continue a
// run of letters, or of digits, on either side.
func replaceWord(s, sec string) string {
	first, _ := utf8.DecodeRuneInString(sec)
	last, _ := utf8.DecodeLastRuneInString(sec)
	var out strings.Builder
	done := 0
	for i := 0; ; {
		j := strings.Index(s[i:], sec)
		if j < 0 {
			break
		}
		j += i
		end := j + len(sec)
		before, _ := utf8.DecodeLastRuneInString(s[:j])
		after, _ := utf8.DecodeRuneInString(s[end:])
		if (j > 0 && sameKind(before, first)) || (end < len(s) && sameKind(after, last)) {
			i = j + 1
			continue
		}
		out.WriteString(s[done:j])
		out.WriteString(Text)
		done, i = end, end
	}
	if done == 0 {
		return s
	}
	out.WriteString(s[done:])
	return out.String()
}

// sameKind reports whether a and b are both letters or both digits.
func sameKind(a, b rune) bool {
	return unicode.IsLetter(a) && unicode.IsLetter(b) || unicode.IsDigit(a) && unicode.IsDigit(b)
}

// CardNumbers returns s with every card number replaced by "****": a run
// of 13 to 19 ASCII digits, with single spaces or dashes allowed between
// them, not part of a longer run of digits, whose digits pass the Luhn
// check. A Scrubber does it too; the failure index calls it alone on the
// text it keeps in clear when payloads are encrypted.
func CardNumbers(s string) string {
	var out strings.Builder
	done := 0
	for i := 0; i < len(s); {
		if !isDigit(s[i]) || (i > 0 && isDigit(s[i-1])) {
			i++
			continue
		}
		end, digits := runEnd(s, i)
		if digits >= 13 && digits <= 19 && luhn(s[i:end]) {
			out.WriteString(s[done:i])
			out.WriteString(Text)
			done = end
		}
		i = end
	}
	if done == 0 {
		return s
	}
	out.WriteString(s[done:])
	return out.String()
}

// runEnd returns the end of the run of digits starting at s[i] (single
// spaces or dashes allowed between two digits) and how many digits it has.
func runEnd(s string, i int) (end, digits int) {
	for j := i; j < len(s); j++ {
		switch {
		case isDigit(s[j]):
			digits++
			end = j + 1
		case (s[j] == ' ' || s[j] == '-') && j+1 < len(s) && isDigit(s[j+1]) && isDigit(s[j-1]):
		default:
			return end, digits
		}
	}
	return end, digits
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// luhn reports whether the digits of s (other bytes skipped) pass the Luhn
// check.
func luhn(s string) bool {
	sum, double := 0, false
	for i := len(s) - 1; i >= 0; i-- {
		if !isDigit(s[i]) {
			continue
		}
		d := int(s[i] - '0')
		if double {
			if d *= 2; d > 9 {
				d -= 9
			}
		}
		sum += d
		double = !double
	}
	return sum%10 == 0
}

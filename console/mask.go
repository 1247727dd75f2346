package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maskText replaces a masked JSON value.
const maskText = "****"

// maskPath is one parsed Config.Mask entry: object keys, "*" for any.
type maskPath []string

func parseMaskPath(s string) (maskPath, error) {
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

// masker masks payloads by JSON paths.
type masker struct{ paths []maskPath }

func newMasker(paths []string) (*masker, error) {
	m := &masker{}
	for _, s := range paths {
		p, err := parseMaskPath(s)
		if err != nil {
			return nil, err
		}
		m.paths = append(m.paths, p)
	}
	return m, nil
}

// active reports whether any path is configured.
func (m *masker) active() bool { return len(m.paths) > 0 }

// match reports whether the value at path is masked: some configured path
// is a prefix of it (so masking an object masks all of it).
func (m *masker) match(path []string) bool {
	for _, p := range m.paths {
		if len(p) > len(path) {
			continue
		}
		ok := true
		for i, seg := range p {
			if seg != "*" && seg != path[i] {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// errNotJSON: a payload that is not JSON cannot be masked.
var errNotJSON = fmt.Errorf("payload is not JSON")

// apply returns v with every masked value replaced by "****", keeping the
// order of object keys and every other value as written, and how many
// values it masked. It returns errNotJSON when v is not one JSON value.
func (m *masker) apply(v []byte) ([]byte, int, error) {
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	var out bytes.Buffer
	n, err := m.value(dec, &out, nil)
	if err != nil {
		return nil, 0, errNotJSON
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, 0, errNotJSON
	}
	return out.Bytes(), n, nil
}

// value copies one JSON value from dec to out, masking what match selects.
func (m *masker) value(dec *json.Decoder, out *bytes.Buffer, path []string) (int, error) {
	masked := m.match(path) && len(path) > 0
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
			c, err := m.value(dec, w, append(path[:len(path):len(path)], seg))
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
		writeJSON(w, t)
	}
	if masked {
		writeJSON(out, maskText)
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

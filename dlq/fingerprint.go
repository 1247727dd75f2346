package dlq

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"

	"github.com/idemhq/idem/handler"
)

var normalisers = []struct {
	re   *regexp.Regexp
	repl string
}{
	{regexp.MustCompile(`"(?:[^"\\]|\\.)*"|\B'(?:[^'\\]|\\.)*'|` + "`[^`]*`"), `"…"`},
	{regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), "<uuid>"},
	{regexp.MustCompile(`(?i)\b0x[0-9a-f]+\b`), "<hex>"},
	{regexp.MustCompile(`(?i)\b[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*\b|\b[0-9a-f]*[a-f][0-9a-f]*[0-9][0-9a-f]*\b`), "<hex>"},
	{regexp.MustCompile(`[0-9]+`), "<n>"},
}

// normalize collapses the parts of an error message that vary between
// occurrences of the same failure, so they group together: quoted strings
// ("…", '…' not preceded by a letter, `…`) become "…", UUIDs <uuid>, hex ids (0x…, or runs of hex
// digits mixing letters and digits) <hex>, and remaining digit runs <n>.
//
//	normalize(`order 12345 for "alice": lock 0xdeadbeef`) == `order <n> for "…": lock <hex>`
func normalize(msg string) string {
	for _, n := range normalisers {
		msg = n.re.ReplaceAllString(msg, n.repl)
	}
	return msg
}

// fingerprint identifies a kind of failure: the first 12 hex digits of the
// SHA-256 of kind, error type and normalize(message). Records with the same
// fingerprint failed the same way; List groups by it and Filter selects by it.
func fingerprint(kind handler.Kind, errorType, message string) string {
	h := sha256.New()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(errorType))
	h.Write([]byte{0})
	h.Write([]byte(normalize(message)))
	return hex.EncodeToString(h.Sum(nil))[:12]
}

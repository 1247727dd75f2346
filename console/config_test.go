package console

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testing/docdefaults"
)

// TestDocumentedDefaults checks every "Default:" line of Config's field docs
// against what defaults makes of the zero Config (SessionKey is drawn by
// New), so the docs cannot drift from the code.
func TestDocumentedDefaults(t *testing.T) {
	d := Config{}.defaults()
	want := map[string]struct {
		doc string // how the doc's Default line starts
		ok  bool   // the zero Config's default is that
	}{
		"Tokens":             {"none, which New accepts only together with InsecureNoAuth", d.Tokens == nil},
		"InsecureNoAuth":     {"false", !d.InsecureNoAuth},
		"Mask":               {"none", d.Mask == nil},
		"EncryptionKeyFile":  {`""`, d.EncryptionKeyFile == ""},
		"EncryptionKey":      {`""`, d.EncryptionKey == ""},
		"BasePath":           {`""`, d.BasePath == ""},
		"SessionKey":         {"32 random bytes per New", d.SessionKey == nil},
		"SessionTTL":         {"12 h", d.SessionTTL == 12*time.Hour},
		"SecureCookies":      {"false", !d.SecureCookies},
		"BehindProxy":        {"false", !d.BehindProxy},
		"ReplayTopics":       {"none", d.ReplayTopics == nil},
		"MaxOperatorRecords": {"100", d.MaxOperatorRecords == 100},
		"MaxRedrivesPerHour": {"6", d.MaxRedrivesPerHour == 6},
		"ReadTimeout":        {"30 s", d.ReadTimeout == 30*time.Second},
		"QueryTimeout":       {"15 s", d.QueryTimeout == 15*time.Second},
		"DisplayBytes":       {"16 KiB", d.DisplayBytes == 16<<10},
		"Logger":             {"slog.Default()", d.Logger == slog.Default()},
		"Registerer":         {"nil", d.Registerer == nil},
		"Registry":           {"nil (values shown as their bytes)", d.Registry == nil},
	}
	docs := docdefaults.Of(t, "config.go", "Config")
	for name, doc := range docs {
		w, ok := want[name]
		switch {
		case !ok:
			t.Errorf("%s: documents Default: %q, which this test does not check: add it", name, doc)
		case !strings.HasPrefix(doc, w.doc):
			t.Errorf("%s: documented %q, want %q", name, doc, w.doc)
		case !w.ok:
			t.Errorf("%s: the zero Config's default is not %q", name, w.doc)
		}
	}
	for name := range want {
		if _, ok := docs[name]; !ok {
			t.Errorf("%s: no Default: line in its doc", name)
		}
	}
}

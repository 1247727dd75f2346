package index

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testing/docdefaults"
)

// TestDocumentedDefaults checks every "Default:" line of the Indexer's
// field docs against what withDefaults makes of the zero Indexer (the
// Sarama default is applied by Run, and checked by its text), so the docs
// cannot drift from the code.
func TestDocumentedDefaults(t *testing.T) {
	docs := docdefaults.Of(t, "indexer.go", "Indexer")
	got := reflect.ValueOf((&Indexer{}).withDefaults()).Elem()
	render := func(v reflect.Value) string {
		switch x := v.Interface().(type) {
		case *regexp.Regexp:
			return "`" + x.String() + "`"
		case string:
			return fmt.Sprintf("%q", x)
		case time.Duration:
			if x%(24*time.Hour) == 0 {
				return fmt.Sprintf("%d days", x/(24*time.Hour))
			}
			return x.String()
		case int:
			if x%(1<<20) == 0 {
				return fmt.Sprintf("%d MiB", x>>20)
			}
			return fmt.Sprint(x)
		}
		if v.IsNil() {
			return "nil"
		}
		return "slog.Default()" // the one non-nil pointer withDefaults sets
	}
	for name, doc := range docs {
		if name == "Sarama" {
			if !strings.HasPrefix(doc, "sarama.NewConfig() with Version V4_0_0_0") {
				t.Errorf("Sarama: documented %q", doc)
			}
			continue
		}
		if name == "Group" { // derived from the database by Run (TestIndexerGroupFollowsTheDatabase)
			if !strings.HasPrefix(doc, `"`+groupPrefix+`-" followed by 12 hex digits`) {
				t.Errorf("Group: documented %q", doc)
			}
			continue
		}
		if want := render(got.FieldByName(name)); !strings.HasPrefix(doc, want) {
			t.Errorf("%s: documented %q, withDefaults gives %s", name, doc, want)
		}
	}
	if len(docs) < 9 {
		t.Fatalf("found %d documented defaults, want 9: is the parser still finding them?", len(docs))
	}
}

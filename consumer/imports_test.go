package consumer_test

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImports: consumer is not a hub (issue 22). It imports only the idem
// packages it runs on; the tables of saga and checkpoint are created by
// idem.Migrate (internal/schema), and a service runs the outbox relay next
// to consumer.Run, so neither saga, checkpoint, outbox nor the root package
// idem comes back as an import. None of them is even a dependency: the
// failure index's queries (the console's outbox actions among them) live in
// internal/failidx, which reaches only the outbox's internal table code.
func TestImports(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var p struct {
		ImportPath    string
		Imports, Deps []string
	}
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	const mod = "github.com/idemhq/idem"
	if p.ImportPath != mod+"/consumer" {
		t.Fatalf("go list gave %q", p.ImportPath)
	}
	may := []string{
		"breaker", "console/index", "dedupe", "dlq", "handler", "metrics", "recovery", "retrytopic", "schedule",
		"internal/adaptive", "internal/committed", "internal/configerr", "internal/control", "internal/coremetrics", "internal/correlation", "internal/pgmigrate", "internal/seal", "internal/expiry", "internal/forward", "internal/tables",
		"internal/keyorder", "internal/mutate",
		"internal/txn", "internal/wire",
	}
	for _, imp := range p.Imports {
		rel, ok := strings.CutPrefix(imp, mod+"/")
		if (ok || imp == mod) && !slices.Contains(may, rel) {
			t.Errorf("consumer imports %s; it may import only these of idem's packages: %v", imp, may)
		}
	}
	for _, dep := range p.Deps {
		for _, never := range []string{mod, mod + "/saga", mod + "/checkpoint", mod + "/outbox"} {
			if dep == never {
				t.Errorf("consumer depends on %s", dep)
			}
		}
	}
	if len(p.Imports) < 10 {
		t.Fatalf("go list gave %d imports", len(p.Imports))
	}
}

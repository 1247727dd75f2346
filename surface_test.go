package idem_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idemhq/idem/internal/testing/apicount"
)

// mostExported bounds the exported top-level identifiers of the public
// packages (issue 22: at most 250, none lost from what a user needs).
const mostExported = 250

// TestExportedSurface: the public API stays within mostExported top-level
// names, counted as `go run ./scripts/exported.go` counts them. A change
// that crosses the bound should move the names only idem uses to
// internal/, or remove a second way to do what a remaining name does;
// `go run ./scripts/exported.go -refs` says where each name is used.
func TestExportedSurface(t *testing.T) {
	pkgs, sum, err := apicount.Count(".")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 || sum.Top < 100 {
		t.Fatalf("counted %d packages and %d names: the walk missed the module", len(pkgs), sum.Top)
	}
	if sum.Top <= mostExported {
		t.Logf("%d exported top-level identifiers (bound %d); %d with methods and fields", sum.Top, mostExported, sum.Total())
		return
	}
	var b strings.Builder
	for _, p := range pkgs {
		fmt.Fprintf(&b, "\n  %-20s %3d", p.Dir, p.Top)
	}
	t.Errorf("the public packages export %d top-level identifiers, more than %d:%s", sum.Top, mostExported, b.String())
}

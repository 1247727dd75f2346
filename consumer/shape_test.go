package consumer_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// methodCeiling is how many methods a type of the package may declare in its
// non-test files (issue 32, item 4: "the worker back to a small type"). A
// feature's steps on the message path are a stage of their own (a struct
// holding the worker, see worker's doc), so the next feature adds a type,
// not methods on worker.
const methodCeiling = 15

// methodRatchet holds the types over methodCeiling today, at their current
// counts: they may shrink, never grow. None is over it now; a type that
// must be is added here with the reason.
var methodRatchet = map[string]int{}

// TestTypesStaySmall counts the methods each type of the package declares
// and fails for a type over methodCeiling (or over its ratchet).
func TestTypesStaySmall(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	counts := map[string]int{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
				continue
			}
			counts[recvType(fd.Recv.List[0].Type)]++
		}
	}
	if counts["worker"] == 0 {
		t.Fatal("no methods of worker found: is the test in the package's directory?")
	}
	var over []string
	for typ, n := range counts {
		limit := methodCeiling
		if r, ok := methodRatchet[typ]; ok {
			limit = r
		}
		if n > limit {
			over = append(over, typ)
		}
	}
	slices.Sort(over)
	for _, typ := range over {
		t.Errorf("%s declares %d methods, more than %d: make the new feature a stage of its own (worker's doc)", typ, counts[typ], max(methodCeiling, methodRatchet[typ]))
	}
}

// recvType is the name of a receiver's type: T for T, *T, T[P] and *T[P].
func recvType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

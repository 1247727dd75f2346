package docdefaults

// Of is the lower-level reader, for the console's tests, which check the
// "Default:" lines against defaults they compute themselves.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// Of returns, for each exported field of the struct typeName declared in
// file whose doc has a "Default: " line, the text after it up to the end of
// that line.
func Of(tb testing.TB, file, typeName string) map[string]string {
	tb.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != typeName {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			if field.Doc == nil || len(field.Names) == 0 || !ast.IsExported(field.Names[0].Name) {
				continue
			}
			if _, text, ok := strings.Cut(field.Doc.Text(), "Default: "); ok {
				out[field.Names[0].Name] = strings.TrimSpace(strings.SplitN(text, "\n", 2)[0])
			}
		}
		return false
	})
	return out
}

// Package docdefaults holds the test check that keeps a config type's
// documented defaults true: every "Default: <value>" line in the doc comment
// of an exported field is compared with that field of the value the
// package's defaults function makes of the zero config (STYLE.md 3). Tests
// call Check, or Of, which only reads a struct's "Default:" lines; nothing
// else imports it.
package docdefaults

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Check compares every "Default:" line of the exported fields of struct type
// typeName, declared in a Go file of dir, with the fields of got (a value of
// that type, defaults applied), reports each mismatch through tb, and returns
// how many lines it checked. A line documenting two fields at once
// ("BackoffBase, BackoffMax time.Duration" with "Default: 100ms and 10s.")
// gives one value per field, joined by " and ".
//
// A value is the first word after "Default:" without a trailing "." or ",":
// a Go duration, an integer, a quoted string, true or false, nil (the field
// is nil), slog.Default() or sarama.NewConfig() (the field is not nil).
func Check(tb testing.TB, dir, typeName string, got any) int {
	tb.Helper()
	v := reflect.ValueOf(got)
	st := findStruct(tb, dir, typeName)
	checked := 0
	for _, field := range st.Fields.List {
		if len(field.Names) == 0 || !field.Names[0].IsExported() || field.Doc == nil {
			continue
		}
		var vals []string
		for line := range strings.SplitSeq(field.Doc.Text(), "\n") {
			if _, text, ok := strings.Cut(line, "Default: "); ok {
				vals = strings.Split(strings.TrimRight(text, "."), " and ")
				break
			}
		}
		if vals == nil {
			continue
		}
		if len(vals) != len(field.Names) {
			vals = vals[:1] // "Default: 0, no deadline." names one value
		}
		for i, name := range field.Names {
			val := vals[min(i, len(vals)-1)]
			if fs := strings.Fields(val); len(fs) > 0 {
				val = strings.TrimRight(fs[0], ".,")
			}
			if msg := mismatch(val, v.FieldByName(name.Name)); msg != "" {
				tb.Errorf("%s.%s: documented %q, %s", typeName, name.Name, val, msg)
			}
			checked++
		}
	}
	return checked
}

// findStruct returns the declaration of struct type name in dir's Go files.
func findStruct(tb testing.TB, dir, name string) *ast.StructType {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		tb.Fatal(err)
	}
	for _, path := range files {
		src, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, src, parser.ParseComments)
		if err != nil {
			tb.Fatal(err)
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, spec := range g.Specs {
				if ts := spec.(*ast.TypeSpec); ts.Name.Name == name {
					if st, ok := ts.Type.(*ast.StructType); ok {
						return st
					}
				}
			}
		}
	}
	tb.Fatalf("no struct type %s in %s", name, dir)
	return nil
}

// mismatch says how v differs from the documented val, or "" if it does not.
func mismatch(val string, v reflect.Value) string {
	is := func() string { return fmt.Sprintf("is %v", v.Interface()) }
	switch {
	case !v.IsValid():
		return "no such field"
	case val == "nil":
		if !v.IsNil() {
			return is()
		}
	case val == "slog.Default()" || val == "sarama.NewConfig()":
		if v.IsNil() {
			return "is nil"
		}
	case v.Type() == reflect.TypeFor[time.Duration]():
		if want, err := time.ParseDuration(val); err != nil || time.Duration(v.Int()) != want {
			return is()
		}
	case v.Kind() == reflect.Bool:
		if want, err := strconv.ParseBool(val); err != nil || v.Bool() != want {
			return is()
		}
	case v.CanInt():
		if want, err := strconv.ParseInt(strings.ReplaceAll(val, ",", ""), 10, 64); err != nil || v.Int() != want {
			return is()
		}
	case v.Kind() == reflect.String:
		if want, err := strconv.Unquote(val); err != nil || v.String() != want {
			return is()
		}
	default:
		return "cannot be checked"
	}
	return ""
}

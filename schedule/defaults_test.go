package schedule

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestDocumentedDefaults checks each "Default:" line of Scheduler's field
// docs against what withDefaults makes of the zero Scheduler.
func TestDocumentedDefaults(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "scheduler.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	got := reflect.ValueOf((&Scheduler{}).withDefaults())
	checked := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.TYPE || g.Specs[0].(*ast.TypeSpec).Name.Name != "Scheduler" {
			continue
		}
		for _, field := range g.Specs[0].(*ast.TypeSpec).Type.(*ast.StructType).Fields.List {
			name := field.Names[0].Name
			_, text, ok := strings.Cut(field.Doc.Text(), "Default: ")
			if !ast.IsExported(name) || !ok {
				continue
			}
			val := strings.TrimSuffix(strings.Fields(text)[0], ".")
			v := got.FieldByName(name)
			checked++
			switch {
			case val == "nil,":
				if !v.IsNil() {
					t.Errorf("%s: documented nil, is %v", name, v.Interface())
				}
			case val == "slog.Default()" || val == "sarama.NewConfig()":
				if v.IsNil() {
					t.Errorf("%s: documented %s, is nil", name, val)
				}
			case v.Type() == reflect.TypeFor[time.Duration]():
				if want, err := time.ParseDuration(val); err != nil || time.Duration(v.Int()) != want {
					t.Errorf("%s: documented %s, is %v", name, val, time.Duration(v.Int()))
				}
			case v.Kind() == reflect.String:
				if want, err := strconv.Unquote(val); err != nil || v.String() != want {
					t.Errorf("%s: documented %s, is %q", name, val, v.String())
				}
			case v.Kind() == reflect.Int:
				if want := strings.ReplaceAll(val, ",", ""); want != strconv.FormatInt(v.Int(), 10) {
					t.Errorf("%s: documented %s, is %d", name, val, v.Int())
				}
			default:
				t.Errorf("%s: cannot check documented default %q", name, val)
			}
		}
	}
	if checked != 12 {
		t.Fatalf("checked %d documented defaults, want 12", checked)
	}
}

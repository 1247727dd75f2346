package outbox

import (
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// TestDocumentedDefaults checks every "Default:" line of Relay's field docs
// against what withDefaults makes of the zero Relay, so the docs cannot
// drift from the code.
func TestDocumentedDefaults(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "relay.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	got := reflect.ValueOf((&Relay{}).withDefaults())
	checked := 0
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Relay" {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			name := field.Names[0].Name
			if !ast.IsExported(name) || field.Doc == nil {
				continue
			}
			for _, line := range strings.Split(field.Doc.Text(), "\n") {
				text, ok := strings.CutPrefix(line, "Default: ")
				if !ok {
					continue
				}
				text = strings.TrimPrefix(text, name+" ") // "Default: RetryBase 100ms."
				val := strings.TrimSuffix(strings.Fields(text)[0], ".")
				checkDefault(t, name, val, got.FieldByName(name))
				checked++
			}
		}
		return false
	})
	if checked < 12 {
		t.Fatalf("checked %d documented defaults; is the parser still finding them?", checked)
	}
}

func checkDefault(t *testing.T, field, val string, v reflect.Value) {
	t.Helper()
	switch {
	case val == "nil," || val == "nil":
		if !v.IsNil() {
			t.Errorf("%s: documented nil, is %v", field, v.Interface())
		}
	case val == "computed": // set by Run, not by withDefaults
		if !v.IsZero() {
			t.Errorf("%s: documented as computed at Run, is %v", field, v.Interface())
		}
	case v.Kind() == reflect.Bool:
		if want, err := strconv.ParseBool(val); err != nil || v.Bool() != want {
			t.Errorf("%s: documented %s, is %v", field, val, v.Bool())
		}
	case val == "slog.Default()" || val == "sarama.NewConfig()":
		if v.IsNil() {
			t.Errorf("%s: documented %s, is nil", field, val)
		}
	case val == "otel.GetTracerProvider()":
		if tp, ok := v.Interface().(trace.TracerProvider); !ok || tp != otel.GetTracerProvider() {
			t.Errorf("%s: documented %s, is %v", field, val, v.Interface())
		}
	case val == "propagation.TraceContext{}":
		if _, ok := v.Interface().(propagation.TraceContext); !ok {
			t.Errorf("%s: documented %s, is %v", field, val, v.Interface())
		}
	case v.Type() == reflect.TypeFor[time.Duration]():
		want, err := time.ParseDuration(val)
		if err != nil || time.Duration(v.Int()) != want {
			t.Errorf("%s: documented %s, is %v", field, val, time.Duration(v.Int()))
		}
	case v.Kind() == reflect.Int:
		want, err := strconv.Atoi(strings.ReplaceAll(val, ",", ""))
		if err != nil || int(v.Int()) != want {
			t.Errorf("%s: documented %s, is %d", field, val, v.Int())
		}
	case v.Kind() == reflect.String:
		if want, _ := strconv.Unquote(val); v.String() != want {
			t.Errorf("%s: documented %s, is %q", field, val, v.String())
		}
	default:
		t.Errorf("%s: cannot check documented default %q", field, val)
	}
}

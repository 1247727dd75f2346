package breaker_test

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/internal/configerr"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*breaker.Settings)
		field  string // "" = valid
	}{
		{"zero value", func(*breaker.Settings) {}, ""},
		{"defaults", func(s *breaker.Settings) { *s = breaker.DefaultSettings() }, ""},
		{"ratio with min requests", func(s *breaker.Settings) { s.FailureRatio, s.MinRequests = 0.5, 20 }, ""},
		{"ratio 1", func(s *breaker.Settings) { s.FailureRatio = 1 }, ""},
		{"ratio above 1", func(s *breaker.Settings) { s.FailureRatio = 1.5 }, "FailureRatio"},
		{"ratio negative", func(s *breaker.Settings) { s.FailureRatio = -0.1 }, "FailureRatio"},
		{"ratio NaN", func(s *breaker.Settings) { s.FailureRatio = math.NaN() }, "FailureRatio"},
		{"min requests without ratio is harmless", func(s *breaker.Settings) { s.MinRequests = 20 }, ""},
		{"negative window", func(s *breaker.Settings) { s.Window = -time.Second }, "Window"},
		{"negative open timeout", func(s *breaker.Settings) { s.OpenTimeout = -time.Second }, "OpenTimeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s breaker.Settings
			tt.mutate(&s)
			err := s.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "breaker: invalid settings") {
				t.Fatalf("Validate() = %v, want an invalid-settings error", err)
			}
			var se *configerr.Error
			if !errors.As(err, &se) || se.Field != "Settings."+tt.field {
				t.Fatalf("Validate() = %v, want an error naming Settings.%s", err, tt.field)
			}
			if _, err := breaker.New("x", s); err == nil || !strings.Contains(err.Error(), "breaker: invalid settings") {
				t.Fatalf("New = %v, want an invalid-settings error", err)
			}
			if _, err := breaker.NewSet(s); err == nil || !strings.Contains(err.Error(), "breaker: invalid settings") {
				t.Fatalf("NewSet = %v, want an invalid-settings error", err)
			}
		})
	}
}

func TestValidateMessageAndJoin(t *testing.T) {
	err := breaker.Settings{FailureRatio: 1.5, OpenTimeout: -time.Second}.Validate()
	msg := err.Error()
	for _, want := range []string{
		"breaker: invalid settings: Settings.FailureRatio = 1.5: must be in [0,1]",
		"breaker: invalid settings: Settings.OpenTimeout = -1s: must be >= 0",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("Validate() = %q, want it to contain %q", msg, want)
		}
	}
}

// TestDocumentedDefaults checks each "Default:" line of the Settings and
// Limits field docs against DefaultSettings and DefaultLimits, and that every
// field has one.
func TestDocumentedDefaults(t *testing.T) {
	t.Run("Settings", func(t *testing.T) { checkDefaults(t, "settings.go", "Settings", breaker.DefaultSettings()) })
	t.Run("Limits", func(t *testing.T) { checkDefaults(t, "limits.go", "Limits", breaker.DefaultLimits()) })
}

// checkDefaults checks the "Default:" lines of struct typ, declared in file,
// against defaults.
func checkDefaults(t *testing.T, file, typ string, defaults any) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != typ {
			return true
		}
		for _, field := range ts.Type.(*ast.StructType).Fields.List {
			for _, line := range strings.Split(field.Doc.Text(), "\n") {
				if v, ok := strings.CutPrefix(line, "Default: "); ok {
					documented[field.Names[0].Name] = strings.Fields(v)[0]
				}
			}
			if _, ok := documented[field.Names[0].Name]; !ok {
				t.Errorf("%s.%s has no \"Default:\" line", typ, field.Names[0].Name)
			}
		}
		return false
	})
	// The first word of each function's "Default:" line: IsFailure's states
	// the rule of the unexported isFailure.
	funcs := map[string]any{"every": breaker.IsFailure, "time.Now": time.Now}
	if len(documented) == 0 {
		t.Fatalf("no documented defaults found for %s in %s", typ, file)
	}
	d := reflect.ValueOf(defaults)
	for name, doc := range documented {
		v := d.FieldByName(name)
		if !v.IsValid() {
			t.Errorf("documented field %s is not in %s", name, typ)
			continue
		}
		var ok bool
		switch v.Kind() {
		case reflect.Int:
			n, err := strconv.ParseInt(doc, 10, 64)
			ok = err == nil && n == v.Int()
		case reflect.Uint32:
			n, err := strconv.ParseUint(doc, 10, 32)
			ok = err == nil && n == v.Uint()
		case reflect.Float64:
			x, err := strconv.ParseFloat(doc, 64)
			ok = err == nil && x == v.Float()
		case reflect.Int64: // time.Duration
			x, err := time.ParseDuration(doc)
			ok = err == nil && int64(x) == v.Int()
		case reflect.Func:
			if doc == "nil" {
				ok = v.IsNil()
			} else if fn, known := funcs[doc]; known {
				ok = !v.IsNil() && v.Pointer() == reflect.ValueOf(fn).Pointer()
			}
		default:
			t.Errorf("%s.%s: kind %s not handled by this test", typ, name, v.Kind())
			continue
		}
		if !ok {
			t.Errorf("%s.%s: documented Default: %s, the defaults have %v", typ, name, doc, v)
		}
	}
}

// TestZeroSettingsUseDefaults checks that the zero Settings behave as documented.
func TestZeroSettingsUseDefaults(t *testing.T) {
	c := newClock()
	b := newBreaker(t, c, breaker.Settings{})
	do(t, b, 4, fail)
	wantState(t, b, breaker.Closed)
	do(t, b, 1, fail)
	wantOpenError(t, b.Do(context.Background(), ok), breaker.Open, 30*time.Second)
	c.Advance(30 * time.Second)
	wantState(t, b, breaker.HalfOpen)
}

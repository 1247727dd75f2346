package consumer

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// requiredFields are the Config fields without a default; every other field
// must document one.
var requiredFields = []string{"Brokers", "Group", "Topics", "Dedupe"}

// groups are the Config fields whose type is a group of options, each field
// of which documents its own default (checked like Config's): the field name
// and the group's type name.
var groups = map[string]string{
	"Retry":        "RetryConfig",
	"Batch":        "BatchConfig",
	"Retention":    "RetentionConfig",
	"Transactions": "TransactionsConfig",
	"Limits":       "LimitsConfig",
	"Expiry":       "Expiry",
}

// pointerGroups are the Config fields whose type is a pointer to a group
// (nil: the feature is off), keyed by their path, with the group's type
// name and a value whose required fields are set: withDefaults must fill
// the rest with their documented defaults. A field whose doc says
// "Required." documents no default.
var pointerGroups = map[string]struct {
	typ string
	set Config
}{
	"Limits.Adaptive": {"Adaptive", Config{Limits: LimitsConfig{Adaptive: &Adaptive{Max: 8}}}},
}

// configFieldDocs parses the package and returns the doc comment of every field
// of Config, in declaration order.
func configFieldDocs(tb testing.TB) (names []string, docs map[string]string) {
	return structFieldDocs(tb, "Config")
}

// structFieldDocs parses the package's non-test files and returns the doc
// comment of every field of the struct type typeName, in declaration order.
func structFieldDocs(tb testing.TB, typeName string) (names []string, docs map[string]string) {
	tb.Helper()
	paths, err := filepath.Glob("*.go")
	if err != nil {
		tb.Fatal(err)
	}
	fset := token.NewFileSet()
	docs = map[string]string{}
	for _, path := range paths {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			tb.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok || ts.Name.Name != typeName {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				tb.Fatalf("%s is a %T, want a struct", typeName, ts.Type)
			}
			for _, fld := range st.Fields.List {
				for _, id := range fld.Names {
					names = append(names, id.Name)
					docs[id.Name] = fld.Doc.Text()
				}
			}
			return false
		})
	}
	if len(names) == 0 {
		tb.Fatalf("type %s not found in package consumer", typeName)
	}
	return names, docs
}

// defaultLines returns the text after "Default:" of every line of doc that
// starts with it.
func defaultLines(doc string) []string {
	var out []string
	for _, line := range strings.Split(doc, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Default:"); ok {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// knownDefaults checks the defaults that are not plain scalars, by behaviour
// where they are functions. The key is the documented text exactly.
var knownDefaults = map[string]func(v reflect.Value) error{
	"LimitsConfig{}": func(v reflect.Value) error {
		if l, ok := v.Interface().(LimitsConfig); !ok || l != (LimitsConfig{}) {
			return fmt.Errorf("is %+v, want the zero LimitsConfig", v.Interface())
		}
		return nil
	},
	"TransactionsConfig{}": func(v reflect.Value) error {
		// Off; its Timeout's default is checked on TransactionsConfig.Timeout.
		if tc, ok := v.Interface().(TransactionsConfig); !ok || tc.Enabled {
			return fmt.Errorf("is %+v, want transactions off", v.Interface())
		}
		return nil
	},
	"RetentionConfig{}": func(v reflect.Value) error {
		if r, ok := v.Interface().(RetentionConfig); !ok || r != (RetentionConfig{}) {
			return fmt.Errorf("is %+v, want the zero RetentionConfig", v.Interface())
		}
		return nil
	},
	"Ordering{}": func(v reflect.Value) error {
		if o, ok := v.Interface().(Ordering); !ok || o != (Ordering{}) || o.String() != "none" {
			return fmt.Errorf("is %v, want the zero Ordering (none)", v.Interface())
		}
		return nil
	},
	`Expiry{Header: "idem-deadline"}`: func(v reflect.Value) error {
		x, ok := v.Interface().(Expiry)
		if !ok || x.Header != "idem-deadline" || x.MaxAge != 0 || x.MaxAgeByTopic != nil || x.Drop || x.OnExpired != nil {
			return fmt.Errorf("is %+v, want Expiry{Header: \"idem-deadline\"}", v.Interface())
		}
		return nil
	},
	`HeaderKey("idempotency-key")`: func(v reflect.Value) error {
		kf, ok := v.Interface().(KeyFunc)
		if !ok || kf == nil {
			return fmt.Errorf("is %T %v, want a non-nil KeyFunc", v.Interface(), v.Interface())
		}
		ref := HeaderKey("idempotency-key")
		msgs := []*handler.Message{
			{},
			{Headers: []handler.Header{{Key: "idempotency-key", Value: []byte("k1")}}},
			{Headers: []handler.Header{{Key: "idempotency-key", Value: []byte("old")}, {Key: "idempotency-key", Value: []byte("new")}}},
			{Headers: []handler.Header{{Key: "Idempotency-Key", Value: []byte("other case")}}},
			{Key: []byte("record-key"), Headers: []handler.Header{{Key: "x-key", Value: []byte("x")}}},
		}
		for i, m := range msgs {
			got, gerr := kf(m)
			want, werr := ref(m)
			if got != want || (gerr == nil) != (werr == nil) {
				return fmt.Errorf("message %d: KeyFunc = %q, %v; HeaderKey(\"idempotency-key\") = %q, %v", i, got, gerr, want, werr)
			}
		}
		return nil
	},
	"BatchConfig{MaxLatency: 50ms}": func(v reflect.Value) error {
		if b, ok := v.Interface().(BatchConfig); !ok || b != (BatchConfig{MaxLatency: 50 * time.Millisecond}) {
			return fmt.Errorf("is %#v, want BatchConfig{MaxLatency: 50ms}", v.Interface())
		}
		return nil
	},
	"RetryConfig{Attempts: 4, Backoff: {Base: 100ms, Max: 5s}}": func(v reflect.Value) error {
		r, ok := v.Interface().(RetryConfig)
		want := RetryConfig{Attempts: 4, Backoff: recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}}
		if !ok || r.Attempts != want.Attempts || r.Backoff != want.Backoff || r.Panics || !reflect.ValueOf(r.Tiers).IsZero() {
			return fmt.Errorf("is %+v, want %+v", v.Interface(), want)
		}
		return nil
	},
	"{Base: 100ms, Max: 5s}": func(v reflect.Value) error {
		if b, ok := v.Interface().(recovery.Backoff); !ok || b != (recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}) {
			return fmt.Errorf("is %+v, want {Base: 100ms, Max: 5s}", v.Interface())
		}
		return nil
	},
	"sarama.NewConfig()": func(v reflect.Value) error {
		c, ok := v.Interface().(*sarama.Config)
		if !ok || c == nil {
			return fmt.Errorf("is %v, want a *sarama.Config", v.Interface())
		}
		ref := sarama.NewConfig()
		var diffs []string
		cmp := func(name string, got, want any) {
			if !reflect.DeepEqual(got, want) {
				diffs = append(diffs, fmt.Sprintf("%s = %v, want %v", name, got, want))
			}
		}
		cmp("Version", c.Version, ref.Version)
		cmp("ClientID", c.ClientID, ref.ClientID)
		cmp("Consumer.Group.Rebalance.Timeout", c.Consumer.Group.Rebalance.Timeout, ref.Consumer.Group.Rebalance.Timeout)
		cmp("Consumer.Group.Session.Timeout", c.Consumer.Group.Session.Timeout, ref.Consumer.Group.Session.Timeout)
		cmp("Consumer.Offsets.Initial", c.Consumer.Offsets.Initial, ref.Consumer.Offsets.Initial)
		cmp("Consumer.Offsets.AutoCommit", c.Consumer.Offsets.AutoCommit, ref.Consumer.Offsets.AutoCommit)
		cmp("Producer.RequiredAcks", c.Producer.RequiredAcks, ref.Producer.RequiredAcks)
		cmp("Net.MaxOpenRequests", c.Net.MaxOpenRequests, ref.Net.MaxOpenRequests)
		var names, refNames []string
		for _, s := range c.Consumer.Group.Rebalance.GroupStrategies {
			names = append(names, s.Name())
		}
		for _, s := range ref.Consumer.Group.Rebalance.GroupStrategies {
			refNames = append(refNames, s.Name())
		}
		cmp("Consumer.Group.Rebalance.GroupStrategies", names, refNames)
		if err := c.Validate(); err != nil {
			diffs = append(diffs, "Validate: "+err.Error())
		}
		if len(diffs) > 0 {
			return errors.New(strings.Join(diffs, "; "))
		}
		return nil
	},
	"otel.GetTracerProvider()": func(v reflect.Value) error {
		if tp, ok := v.Interface().(trace.TracerProvider); !ok || tp != otel.GetTracerProvider() {
			return fmt.Errorf("is %v, want otel.GetTracerProvider()", v.Interface())
		}
		return nil
	},
	"propagation.TraceContext{}": func(v reflect.Value) error {
		if _, ok := v.Interface().(propagation.TraceContext); !ok {
			return fmt.Errorf("is %T, want propagation.TraceContext{}", v.Interface())
		}
		return nil
	},
	"slog.Default()": func(v reflect.Value) error {
		if l, ok := v.Interface().(*slog.Logger); !ok || l != slog.Default() {
			return fmt.Errorf("is %v, want slog.Default()", v.Interface())
		}
		return nil
	},
	"retrytopic.Policy{}": func(v reflect.Value) error {
		p, ok := v.Interface().(retrytopic.Policy)
		if !ok || !v.IsZero() {
			return fmt.Errorf("is %+v, want the zero retrytopic.Policy", v.Interface())
		}
		// The doc's promise: no tiers; dead-letter topic "<topic>.<group>.dlq".
		if tiers := p.WithDefaults().Tiers("t", "g"); len(tiers) != 0 {
			return fmt.Errorf("has tiers %v, want none", tiers)
		}
		if dlq := p.WithDefaults().DLQ("t", "g"); dlq != "t.g.dlq" {
			return fmt.Errorf("dead-letter topic of t/g is %q, want t.g.dlq", dlq)
		}
		return nil
	},
}

var durationType = reflect.TypeFor[time.Duration]()

// packageConst finds the integer constant name among the package's non-test
// files and returns its declared type name and value. It understands const
// blocks built with iota and implicit repetition, which is how enumerations
// are written here.
func packageConst(name string) (typeName string, value int64, err error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		return "", 0, err
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return "", 0, err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			var typ ast.Expr
			var values []ast.Expr
			for idx, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if vs.Type != nil || len(vs.Values) > 0 {
					typ, values = vs.Type, vs.Values // else: implicit repetition
				}
				for i, id := range vs.Names {
					if id.Name != name {
						continue
					}
					tn, ok := typ.(*ast.Ident)
					if !ok || i >= len(values) {
						return "", 0, fmt.Errorf("constant %s: cannot tell its type and value", name)
					}
					v, ok := evalConst(values[i], int64(idx))
					if !ok {
						return "", 0, fmt.Errorf("constant %s: cannot evaluate %T", name, values[i])
					}
					return tn.Name, v, nil
				}
			}
		}
	}
	return "", 0, fmt.Errorf("no constant %s in package consumer", name)
}

// evalConst evaluates the integer constant expressions enumerations use.
func evalConst(e ast.Expr, iota int64) (int64, bool) {
	switch e := e.(type) {
	case *ast.Ident:
		return iota, e.Name == "iota"
	case *ast.BasicLit:
		if e.Kind != token.INT {
			return 0, false
		}
		v, err := strconv.ParseInt(e.Value, 0, 64)
		return v, err == nil
	case *ast.ParenExpr:
		return evalConst(e.X, iota)
	case *ast.UnaryExpr:
		x, ok := evalConst(e.X, iota)
		return -x, ok && e.Op == token.SUB
	case *ast.BinaryExpr:
		x, okx := evalConst(e.X, iota)
		y, oky := evalConst(e.Y, iota)
		if !okx || !oky {
			return 0, false
		}
		switch e.Op {
		case token.ADD:
			return x + y, true
		case token.SUB:
			return x - y, true
		case token.MUL:
			return x * y, true
		case token.SHL:
			return x << y, true
		}
	}
	return 0, false
}

// checkValue checks that field of the struct c holds the documented value text.
func checkValue(c reflect.Value, field, text string) error {
	v := c.FieldByName(field)
	if !v.IsValid() {
		return fmt.Errorf("the doc names field %s, which %s does not have", field, c.Type().Name())
	}
	if check, ok := knownDefaults[text]; ok {
		return check(v)
	}
	if token.IsIdentifier(text) && v.CanInt() {
		// A named constant of the package, such as MissingKeyDeadLetter.
		typ, want, err := packageConst(text)
		if err != nil {
			return err
		}
		if typ != v.Type().Name() {
			return fmt.Errorf("documented %s is a %s constant, but the field is a %s", text, typ, v.Type())
		}
		if got := v.Int(); got != want {
			return fmt.Errorf("is %v (%d), documented %s (%d)", v.Interface(), got, text, want)
		}
		return nil
	}
	switch {
	case v.Type() == durationType:
		want, err := time.ParseDuration(text)
		if err != nil {
			return fmt.Errorf("cannot parse duration %q: %v", text, err)
		}
		if got := time.Duration(v.Int()); got != want {
			return fmt.Errorf("is %v, documented %v", got, want)
		}
		return nil
	case v.Kind() == reflect.Int:
		if want, err := strconv.Atoi(text); err == nil {
			if got := v.Int(); got != int64(want) {
				return fmt.Errorf("is %d, documented %d", got, want)
			}
			return nil
		}
	case v.Kind() == reflect.Bool:
		if want, err := strconv.ParseBool(text); err == nil {
			if v.Bool() != want {
				return fmt.Errorf("is %v, documented %v", v.Bool(), want)
			}
			return nil
		}
	}
	if v.CanFloat() {
		if want, err := strconv.ParseFloat(text, 64); err == nil {
			if got := v.Float(); got != want {
				return fmt.Errorf("is %v, documented %v", got, want)
			}
			return nil
		}
	}
	if want, err := strconv.Unquote(text); err == nil && v.Kind() == reflect.String {
		if got := v.String(); got != want {
			return fmt.Errorf("is %q, documented %q", got, want)
		}
		return nil
	}
	if text == "nil" {
		switch v.Kind() {
		case reflect.Interface, reflect.Pointer, reflect.Func, reflect.Map, reflect.Slice:
			if !v.IsNil() {
				return fmt.Errorf("is %v, documented nil", v.Interface())
			}
			return nil
		}
	}
	return fmt.Errorf("TestDocumentedDefaults does not know how to check %q for a %s; teach it (knownDefaults)", text, v.Type())
}

// checkDefaultLine checks one "Default:" line of field against c. The line is
// either one value ("5s", "nil, metrics are…", "1s. Kafka: …",
// "retrytopic.Policy{} (no tiers…)") or "Field value" pairs separated by ", "
// ("ShutdownGrace 10s, CommitInterval 1s").
func checkDefaultLine(c reflect.Value, field, line string) []error {
	text, _, _ := strings.Cut(line, "Kafka:")
	text = strings.TrimSuffix(strings.TrimSpace(text), ".")

	// "Field value, Field value": every part names a Config field.
	parts := strings.Split(text, ", ")
	pairs := true
	for _, p := range parts {
		name, val, ok := strings.Cut(p, " ")
		if !ok || strings.Contains(val, " ") || !c.FieldByName(name).IsValid() {
			pairs = false
			break
		}
	}
	if pairs {
		var errs []error
		mentionsSelf := false
		for _, p := range parts {
			name, val, _ := strings.Cut(p, " ")
			mentionsSelf = mentionsSelf || name == field
			if err := checkValue(c, name, val); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
		if !mentionsSelf {
			errs = append(errs, fmt.Errorf("the default of %s names only other fields: %q", field, line))
		}
		return errs
	}

	// One value, possibly followed by an explanation.
	val := text
	for _, sep := range []string{" (", ", ", ". "} {
		val, _, _ = strings.Cut(val, sep)
	}
	val = strings.TrimSuffix(strings.TrimSpace(val), ".")
	for k := range knownDefaults { // composite literals hold ", " themselves
		if text == k || strings.HasPrefix(text, k+" (") || strings.HasPrefix(text, k+". ") {
			val = k
		}
	}
	if err := checkValue(c, field, val); err != nil {
		return []error{err}
	}
	return nil
}

// TestDocumentedDefaults checks every "Default:" line of Config's field docs
// against defaults() and against what withDefaults makes of the zero Config,
// so that the docs cannot drift from the code.
func TestDocumentedDefaults(t *testing.T) {
	names, docs := configFieldDocs(t)
	configs := map[string]Config{
		"defaults()":              defaults(),
		"Config{}.withDefaults()": Config{}.withDefaults(),
	}
	checked := 0
	for _, field := range names {
		lines := defaultLines(docs[field])
		required := slices.Contains(requiredFields, field)
		switch {
		case required && len(lines) > 0:
			t.Errorf("%s is required but documents a default %q", field, lines)
			continue
		case required:
			continue
		case len(lines) == 0:
			t.Errorf("%s has no \"Default:\" line in its doc; every optional field must say its default", field)
			continue
		case len(lines) > 1:
			t.Errorf("%s has %d \"Default:\" lines, want one: %q", field, len(lines), lines)
		}
		for label, c := range configs {
			for _, err := range checkDefaultLine(reflect.ValueOf(c), field, lines[0]) {
				t.Errorf("%s: documented %q: %s %v", field, lines[0], label, err)
			}
		}
		checked++
	}

	// The fields of each group (Config.Retry...) document their defaults too.
	for field, typ := range groups {
		gnames, gdocs := structFieldDocs(t, typ)
		for _, gf := range gnames {
			lines := defaultLines(gdocs[gf])
			if len(lines) != 1 {
				t.Errorf("%s.%s has %d \"Default:\" lines, want one: %q", typ, gf, len(lines), lines)
				continue
			}
			for label, c := range configs {
				g := reflect.ValueOf(c).FieldByName(field)
				for _, err := range checkDefaultLine(g, gf, lines[0]) {
					t.Errorf("%s.%s: documented %q: %s %v", typ, gf, lines[0], label, err)
				}
			}
			checked++
		}
	}
	for path, pg := range pointerGroups {
		gnames, gdocs := structFieldDocs(t, pg.typ)
		g := reflect.ValueOf(pg.set.withDefaults())
		for _, name := range strings.Split(path, ".") {
			g = reflect.Indirect(g.FieldByName(name))
		}
		for _, gf := range gnames {
			lines := defaultLines(gdocs[gf])
			if len(lines) == 0 && strings.Contains(gdocs[gf], "Required.") {
				continue
			}
			if len(lines) != 1 {
				t.Errorf("%s.%s has %d \"Default:\" lines, want one (or \"Required.\"): %q", pg.typ, gf, len(lines), lines)
				continue
			}
			for _, err := range checkDefaultLine(g, gf, lines[0]) {
				t.Errorf("%s.%s: documented %q: %s.withDefaults() %v", pg.typ, gf, lines[0], path, err)
			}
			checked++
		}
	}
	a := &Adaptive{Max: 8}
	if filled := (Config{Limits: LimitsConfig{Adaptive: a}}).withDefaults().Limits.Adaptive; filled == a || *a != (Adaptive{Max: 8}) {
		t.Errorf("withDefaults changed the caller's Adaptive, or returned it: it must fill a copy")
	}

	if checked < 10 {
		t.Errorf("checked only %d documented defaults; is the parser still finding them?", checked)
	}

	// Every field defaults() sets is documented as optional.
	d := reflect.ValueOf(defaults())
	for i := range d.NumField() {
		name := d.Type().Field(i).Name
		if !d.Field(i).IsZero() && slices.Contains(requiredFields, name) {
			t.Errorf("defaults() sets required field %s", name)
		}
	}

	// defaults() must hand out a fresh sarama config each time: Run copies and
	// adjusts it, and two Runs must never share one.
	if a, b := defaults().Sarama, defaults().Sarama; a == b {
		t.Errorf("defaults() returns the same *sarama.Config twice")
	}

	// The required fields are exactly what the zero Config is missing.
	var missing []string
	for _, ce := range configErrors(Config{}.Validate()) {
		if !slices.Contains(missing, ce.Field) {
			missing = append(missing, ce.Field)
		}
	}
	slices.Sort(missing)
	want := slices.Sorted(slices.Values(requiredFields))
	if !slices.Equal(missing, want) {
		t.Errorf("Config{}.Validate() complains about %v, want exactly the required fields %v", missing, want)
	}
}

// TestDocumentedDefaultsKeepExplicitValues: withDefaults only fills zero
// fields; Retry.Attempts 1 means "no in-process retries" and stays 1.
func TestDocumentedDefaultsKeepExplicitValues(t *testing.T) {
	sc := sarama.NewConfig()
	logger := slog.New(slog.DiscardHandler)
	c := Config{
		MaxKeyLength: 64, MissingKey: MissingKeyUseCoordinates, Sarama: sc, Logger: logger,
		ShutdownGrace: time.Second, CommitInterval: 2 * time.Second, OutageBackoff: time.Minute,
		Retry: RetryConfig{Attempts: 7, Backoff: recovery.Backoff{Base: time.Millisecond, Max: time.Second}, Panics: true},
	}.withDefaults()
	if c.MaxKeyLength != 64 || c.MissingKey != MissingKeyUseCoordinates || c.Sarama != sc || c.Logger != logger ||
		c.ShutdownGrace != time.Second || c.CommitInterval != 2*time.Second || c.OutageBackoff != time.Minute ||
		c.Retry.Attempts != 7 || c.Retry.Backoff.Base != time.Millisecond || c.Retry.Backoff.Max != time.Second || !c.Retry.Panics {
		t.Fatalf("withDefaults changed explicit values: %+v", c)
	}
	if got := (Config{Retry: RetryConfig{Attempts: 1}}).withDefaults().Retry.Attempts; got != 1 {
		t.Fatalf("Retry.Attempts 1 became %d, want 1 (in-process retries disabled)", got)
	}
}

// configErrors returns every problem of the Config in err's tree (each a
// *configerr.Error matching ErrInvalidConfig; not the nested errors a
// group's own validator reported), as copies whose Field is without
// "Config.".
func configErrors(err error) []*configerr.Error {
	var out []*configerr.Error
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if ce, ok := err.(*configerr.Error); ok && ce.Sentinel == ErrInvalidConfig {
			c := *ce
			c.Field = strings.TrimPrefix(c.Field, "Config.")
			out = append(out, &c)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// validConfig is the smallest Config that passes Validate.
func validConfig() Config {
	return Config{
		Brokers: []string{"localhost:9092"},
		Group:   "billing",
		Topics:  []string{"payments"},
		Dedupe:  dedupe.NewMemory(),
	}
}

func saramaWithRebalanceTimeout(d time.Duration) *sarama.Config {
	sc := sarama.NewConfig()
	sc.Consumer.Group.Rebalance.Timeout = d
	return sc
}

func TestValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("validConfig().Validate() = %v, want nil", err)
	}
	tests := []struct {
		name   string
		mutate func(c *Config)
		field  string // "" means valid
	}{
		// Valid variations.
		{"Retry.Attempts 1 disables in-process retries", func(c *Config) { c.Retry.Attempts = 1 }, ""},
		{"Backoff.Max equal to Backoff.Base", func(c *Config) { c.Retry.Backoff.Base, c.Retry.Backoff.Max = time.Second, time.Second }, ""},
		{"coordinates as keys", func(c *Config) { c.MissingKey = MissingKeyUseCoordinates }, ""},
		{"grace just under the rebalance timeout", func(c *Config) { c.ShutdownGrace = 60*time.Second - time.Nanosecond }, ""},
		{"long grace with a longer rebalance timeout", func(c *Config) {
			c.Sarama, c.ShutdownGrace = saramaWithRebalanceTimeout(2*time.Minute), 90*time.Second
		}, ""},
		{"retry tiers", func(c *Config) { c.Retry.Tiers.Delays = []time.Duration{time.Second, time.Minute} }, ""},
		{"several brokers and topics", func(c *Config) {
			c.Brokers = []string{"a:9092", "b:9092"}
			c.Topics = []string{"payments", "refunds"}
		}, ""},

		// One broken field each.
		{"no brokers", func(c *Config) { c.Brokers = nil }, "Brokers"},
		{"broker without port", func(c *Config) { c.Brokers = []string{"localhost"} }, "Brokers"},
		{"blank broker", func(c *Config) { c.Brokers = []string{"a:9092", "  "} }, "Brokers"},
		{"no group", func(c *Config) { c.Group = "" }, "Group"},
		{"blank group", func(c *Config) { c.Group = " \t" }, "Group"},
		{"no topics", func(c *Config) { c.Topics = nil }, "Topics"},
		{"empty topic name", func(c *Config) { c.Topics = []string{"payments", ""} }, "Topics"},
		{"topic listed twice", func(c *Config) { c.Topics = []string{"payments", "payments"} }, "Topics"},
		{"no dedupe store", func(c *Config) { c.Dedupe = nil }, "Dedupe"},
		{"negative MaxKeyLength", func(c *Config) { c.MaxKeyLength = -1 }, "MaxKeyLength"},
		{"unknown MissingKey policy", func(c *Config) { c.MissingKey = MissingKeyPolicy(7) }, "MissingKey"},
		{"negative ShutdownGrace", func(c *Config) { c.ShutdownGrace = -time.Second }, "ShutdownGrace"},
		{"negative CommitInterval", func(c *Config) { c.CommitInterval = -time.Second }, "CommitInterval"},
		{"negative OutageBackoff", func(c *Config) { c.OutageBackoff = -time.Second }, "OutageBackoff"},
		{"retry delay of zero", func(c *Config) { c.Retry.Tiers.Delays = []time.Duration{time.Second, 0} }, "Retry.Tiers"},
		{"tier named like the source topic", func(c *Config) {
			c.Retry.Tiers.Delays = []time.Duration{time.Second}
			c.Retry.Tiers.TierTopic = func(topic, group string, n int) string { return topic }
		}, "Retry.Tiers"},
		{"derived names too long for Kafka", func(c *Config) {
			c.Topics = []string{strings.Repeat("p", 240)} // a legal topic, but "<topic>.billing.dlq" is not
		}, "Retry.Tiers"},
		{"negative Backoff.Base", func(c *Config) { c.Retry.Backoff.Base = -time.Millisecond }, "Retry.Backoff.Base"},
		{"negative Retry.Attempts", func(c *Config) { c.Retry.Attempts = -1 }, "Retry.Attempts"},
		{"ByKey with a pool", func(c *Config) { c.Ordering = ByKey(someDB{}) }, ""},
		{"ByKey without a pool", func(c *Config) { c.Ordering = ByKey(nil) }, "Ordering"},

		// Contradictory combinations.
		{"ShutdownGrace equal to the rebalance timeout", func(c *Config) { c.ShutdownGrace = 60 * time.Second }, "ShutdownGrace"},
		{"ShutdownGrace longer than the rebalance timeout", func(c *Config) { c.ShutdownGrace = 2 * time.Minute }, "ShutdownGrace"},
		{"default ShutdownGrace over a short rebalance timeout", func(c *Config) {
			c.Sarama = saramaWithRebalanceTimeout(5 * time.Second)
		}, "ShutdownGrace"},
		{"Backoff.Max below Backoff.Base", func(c *Config) { c.Retry.Backoff.Base, c.Retry.Backoff.Max = 2*time.Second, time.Second }, "Retry.Backoff.Max"},
		{"Backoff.Base above the default Max", func(c *Config) { c.Retry.Backoff.Base = 10 * time.Second }, "Retry.Backoff.Max"},
		{"Backoff.Max below the default Base", func(c *Config) { c.Retry.Backoff.Max = 50 * time.Millisecond }, "Retry.Backoff.Max"},
		{"negative Backoff.Max", func(c *Config) { c.Retry.Backoff.Max = -time.Second }, "Retry.Backoff.Max"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.mutate(&c)
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v; want an error wrapping ErrInvalidConfig", err)
			}
			ces := configErrors(err)
			if len(ces) == 0 {
				t.Fatalf("Validate() = %v; want a *configerr.Error", err)
			}
			if ces[0].Field != tt.field {
				t.Fatalf("first problem is of %s, want %s:\n%v", ces[0].Field, tt.field, err)
			}
			for _, ce := range ces {
				if ce.Field != tt.field {
					t.Errorf("Validate() also reports %s; want only %s:\n%v", ce.Field, tt.field, err)
				}
				if ce.Rule == "" && ce.Err == nil {
					t.Errorf("the problem of %s has no rule", ce.Field)
				}
			}
			if !strings.Contains(err.Error(), "Config."+tt.field) {
				t.Errorf("Error() = %q does not name Config.%s", err, tt.field)
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := Config{Brokers: []string{"nohost"}, Retry: RetryConfig{Attempts: -1, Backoff: recovery.Backoff{Base: -1}}, ShutdownGrace: time.Hour}
	var fields []string
	for _, ce := range configErrors(c.Validate()) {
		fields = append(fields, ce.Field)
	}
	for _, want := range []string{"Brokers", "Group", "Topics", "Dedupe", "ShutdownGrace", "Retry.Attempts", "Retry.Backoff.Base"} {
		if !slices.Contains(fields, want) {
			t.Errorf("Validate() reported %v; missing %s", fields, want)
		}
	}

	// A group's own validator reports every problem too, one error
	// each: two of Expiry, two of Limits.Adaptive.
	c = validConfig()
	c.Expiry = Expiry{MaxAge: -time.Second, Header: "a\x00b"}
	c.Limits.Adaptive = &Adaptive{Max: 2000, Tolerance: 1}
	count := map[string]int{}
	for _, ce := range configErrors(c.Validate()) {
		count[ce.Field]++
	}
	if count["Expiry"] != 2 || count["Limits.Adaptive"] != 2 || len(count) != 2 {
		t.Errorf("Validate() reported %v; want Expiry 2, Limits.Adaptive 2", count)
	}
}

package metrics_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/internal/coremetrics"
)

// docRow is one metric as documented, declared or registered.
type docRow struct {
	typ    string   // counter, gauge, histogram, summary
	labels []string // sorted
}

func (r docRow) String() string { return r.typ + "{" + strings.Join(r.labels, ",") + "}" }

func (r docRow) equal(o docRow) bool { return r.typ == o.typ && slices.Equal(r.labels, o.labels) }

// docTable parses the metrics table of doc.go: comment lines "\tidem_… type labels meaning".
func docTable(t *testing.T) map[string]docRow {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]docRow{}
	for _, line := range strings.Split(string(src), "\n") {
		rest, ok := strings.CutPrefix(line, "//\tidem_")
		if !ok {
			continue
		}
		f := strings.Fields("idem_" + rest)
		if len(f) < 4 {
			t.Errorf("doc.go: row %q needs name, type, labels and meaning", line)
			continue
		}
		var labels []string
		if f[2] != "-" {
			labels = strings.Split(f[2], ",")
		}
		slices.Sort(labels)
		if _, dup := rows[f[0]]; dup {
			t.Errorf("doc.go: %s documented twice", f[0])
		}
		rows[f[0]] = docRow{typ: f[1], labels: labels}
	}
	if len(rows) == 0 {
		t.Fatal("doc.go: no metrics table found")
	}
	return rows
}

var newCollector = regexp.MustCompile(`^New(Counter|Gauge|Histogram|Summary)(Vec)?$`)

// elsewhere are the files that declare the collectors: the consumer's
// (internal/coremetrics, registered by coremetrics.New) and those of the
// components that keep their own (registered by those packages), all
// documented in doc.go's table.
var elsewhere = []string{"../internal/coremetrics/coremetrics.go", "../outbox/metrics.go", "../saga/metrics.go", "../checkpoint/metrics.go", "../schedule/metrics.go"}

// declared finds every collector the package's source, and the files
// elsewhere, construct:
// prometheus.New<Type>[Vec](prometheus.<Type>Opts{Name: "…"}, labels), with
// labels a []string literal or a variable assigned one in the same function.
func declared(t *testing.T) map[string]docRow {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, elsewhere...)
	out := map[string]docRow{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			vars := map[string][]string{} // label slices assigned to a variable in this function
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if as, ok := n.(*ast.AssignStmt); ok && len(as.Lhs) == len(as.Rhs) {
					for i, l := range as.Lhs {
						if id, ok := l.(*ast.Ident); ok {
							if ls, ok := stringSlice(as.Rhs[i]); ok {
								vars[id.Name] = ls
							}
						}
					}
				}
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				sel, ok := call.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
					return true
				}
				m := newCollector.FindStringSubmatch(sel.Sel.Name)
				if m == nil || len(call.Args) == 0 {
					return true
				}
				metric := optName(call.Args[0])
				if metric == "" {
					t.Errorf("%s: %s without a literal Name", fset.Position(call.Pos()), sel.Sel.Name)
					return true
				}
				var labels []string
				if m[2] == "Vec" {
					if len(call.Args) < 2 {
						t.Errorf("%s: %s without labels", fset.Position(call.Pos()), metric)
						return true
					}
					ls, ok := stringSlice(call.Args[1])
					if id, isID := call.Args[1].(*ast.Ident); !ok && isID {
						ls, ok = vars[id.Name]
					}
					if !ok {
						t.Errorf("%s: the labels of %s are neither a []string literal nor a variable assigned one", fset.Position(call.Pos()), metric)
						return true
					}
					labels = slices.Clone(ls)
				}
				slices.Sort(labels)
				out[metric] = docRow{typ: strings.ToLower(m[1]), labels: labels}
				return true
			})
		}
	}
	return out
}

func stringSlice(e ast.Expr) ([]string, bool) {
	cl, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, false
	}
	if at, ok := cl.Type.(*ast.ArrayType); !ok || at.Len != nil {
		return nil, false
	} else if id, ok := at.Elt.(*ast.Ident); !ok || id.Name != "string" {
		return nil, false
	}
	var out []string
	for _, el := range cl.Elts {
		lit, ok := el.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return nil, false
		}
		s, err := strconv.Unquote(lit.Value)
		if err != nil {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// optName returns the Name of a prometheus.<Type>Opts literal.
func optName(e ast.Expr) string {
	cl, ok := e.(*ast.CompositeLit)
	if !ok {
		return ""
	}
	for _, el := range cl.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Name" {
			if lit, ok := kv.Value.(*ast.BasicLit); ok {
				s, _ := strconv.Unquote(lit.Value)
				return s
			}
		}
	}
	return ""
}

// observeAll gives every collector field of the struct v one series.
func observeAll(t *testing.T, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		ch := make(chan *prometheus.Desc, 1)
		c.Describe(ch)
		d := (<-ch).String()
		sm := variableLabels.FindStringSubmatch(d)
		if sm == nil {
			t.Fatalf("%s: cannot read the labels of %s", v.Type().Field(i).Name, d)
		}
		var vals []string
		if sm[1] != "" {
			vals = make([]string, len(strings.Split(sm[1], ",")))
		}
		for j := range vals {
			vals[j] = "x"
		}
		switch c := c.(type) {
		case *prometheus.CounterVec:
			c.WithLabelValues(vals...).Inc()
		case *prometheus.GaugeVec:
			c.WithLabelValues(vals...).Inc()
		case *prometheus.HistogramVec:
			c.WithLabelValues(vals...).Observe(1)
		case *prometheus.SummaryVec:
			c.WithLabelValues(vals...).Observe(1)
		default:
			t.Fatalf("%s: unexpected collector %T", v.Type().Field(i).Name, c)
		}
	}
}

var variableLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)

// registered returns what coremetrics.New registers,
// as gathered from the registry once every vector has one series.
func registered(t *testing.T) map[string]docRow {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := coremetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	observeAll(t, reflect.ValueOf(m).Elem())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]docRow{}
	for _, mf := range mfs {
		var labels []string
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		slices.Sort(labels)
		out[mf.GetName()] = docRow{typ: strings.ToLower(mf.GetType().String()), labels: labels}
	}
	return out
}

// TestDocTable checks doc.go's table against the registry (every collector
// coremetrics.New registers, gathered) and against every collector the
// package's source and the files elsewhere declare (coremetrics.New's, and the
// outbox relay's, saga orchestrator's, checkpoint runner's and scheduler's): the same
// names, types and labels, both ways.
func TestDocTable(t *testing.T) {
	doc := docTable(t)
	decl := declared(t)
	reg := registered(t)
	for name, r := range reg {
		if !strings.HasPrefix(name, "idem_") {
			t.Errorf("registered %s lacks the idem_ prefix", name)
		}
		d, ok := doc[name]
		switch {
		case !ok:
			t.Errorf("registered %s %s is not in doc.go's table", name, r)
		case !d.equal(r):
			t.Errorf("%s: registered %s, documented %s", name, r, d)
		}
	}
	for name, r := range decl {
		d, ok := doc[name]
		switch {
		case !ok:
			t.Errorf("declared %s %s is not in doc.go's table", name, r)
		case !d.equal(r):
			t.Errorf("%s: declared %s, documented %s", name, r, d)
		}
	}
	for name, d := range doc {
		if _, ok := decl[name]; ok {
			continue
		}
		t.Errorf("documented %s %s: no collector declares it", name, d)
	}
	for name := range decl {
		if _, ok := reg[name]; !ok && !ownedElsewhere(name) {
			t.Errorf("declared %s is not registered by coremetrics.New", name)
		}
	}
}

// ownedElsewhere reports whether metric belongs to a component that
// registers its own collectors (the files elsewhere).
func ownedElsewhere(metric string) bool {
	for _, p := range []string{"idem_outbox_", "idem_saga_", "idem_checkpoint_", "idem_schedule_"} {
		if strings.HasPrefix(metric, p) {
			return true
		}
	}
	return false
}

// TestAttemptResultsDocumented: every Result label value of
// idem_handler_attempts_total is named in doc.go's row and in the Help text.
func TestAttemptResultsDocumented(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for _, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "//\tidem_handler_attempts_total ") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("doc.go: no idem_handler_attempts_total row")
	}
	reg := prometheus.NewRegistry()
	m, err := coremetrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	help := make(chan *prometheus.Desc, 1)
	m.Attempts.Describe(help)
	desc := (<-help).String()
	for _, r := range []string{coremetrics.ResultOK, coremetrics.ResultError, coremetrics.ResultPanic, coremetrics.ResultBreakerOpen, coremetrics.ResultThrottled} {
		if !strings.Contains(row, r) {
			t.Errorf("doc.go's idem_handler_attempts_total row does not name result %q: %s", r, row)
		}
		if !strings.Contains(desc, r) {
			t.Errorf("idem_handler_attempts_total's Help does not name result %q: %s", r, desc)
		}
	}
}

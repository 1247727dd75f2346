package doctest

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// A snippet is one Go code block of the documentation.
type snippet struct {
	where string // file:line of its first line
	code  string
	// before holds the earlier statement blocks of the same document: a
	// block of statements is compiled after them, so that a document may
	// continue an example over several blocks.
	before []string
}

// givens are the names a fragment may use without declaring them, so that
// documentation can show the interesting lines only. Nothing else is
// implied: every other name must be declared by the snippet or be an
// imported package (see imports).
const givens = `
var (
	ctx     context.Context     // the service's context
	pool    *pgxpool.Pool       // its PostgreSQL pool
	reg     *prometheus.Registry // its metrics registry
	brokers []string            // Kafka bootstrap addresses
	h       handler.Handler     // a handler
	bank    Bank                // a remote dependency
	logging handler.Middleware  // middlewares of the service's own
	tracing handler.Middleware
	t       *testing.T          // the test, in test-kit snippets
	m       *handler.Message    // the message, in handler fragments
	tx      pgx.Tx              // a transaction (dedupe.Tx(ctx) in a handler)

	// Values and functions of the examples.
	orderID               string // an order's id
	input, event          []byte // a saga's input, an event's JSON
	reserve, charge, ship func(context.Context, saga.Call) ([]byte, error)
	release, refund       func(context.Context, saga.Call) error

	// Low-level snippets (package retrytopic).
	admin sarama.ClusterAdmin
	cfg   *sarama.Config
	msg   *sarama.ConsumerMessage
)

// Payment is a message body of the examples.
type Payment struct {
	OrderID string
	Amount  int64
}

// Invoice is a row of the batch-job examples.
type Invoice struct {
	ID    string
	Cents int64
}

// Bank is a remote dependency of the examples.
type Bank interface {
	Charge(ctx context.Context, p Payment) error
}
`

// givenImports are always imported: givens uses them.
var givenImports = []string{"context", "testing", "github.com/IBM/sarama", "github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgxpool",
	"github.com/prometheus/client_golang/prometheus", "github.com/idemhq/idem/handler",
	"github.com/idemhq/idem/saga"}

// imports are the packages a fragment may use by their name; only those it
// uses are imported.
var imports = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "json": "encoding/json", "log": "log",
	"slog": "log/slog", "os": "os", "signal": "os/signal", "syscall": "syscall", "time": "time",
	"testing": "testing", "atomic": "sync/atomic", "http": "net/http", "tls": "crypto/tls",
	"sarama": "github.com/IBM/sarama", "pgxpool": "github.com/jackc/pgx/v5/pgxpool", "pgx": "github.com/jackc/pgx/v5",
	"prometheus": "github.com/prometheus/client_golang/prometheus",
	"breaker":    "github.com/idemhq/idem/breaker", "consumer": "github.com/idemhq/idem/consumer",
	"dedupe": "github.com/idemhq/idem/dedupe", "dedupetest": "github.com/idemhq/idem/dedupe/dedupetest",
	"dlq": "github.com/idemhq/idem/dlq", "handler": "github.com/idemhq/idem/handler",
	"idemtest": "github.com/idemhq/idem/idemtest", "metrics": "github.com/idemhq/idem/metrics",
	"retrytopic": "github.com/idemhq/idem/retrytopic", "kafkaauth": "github.com/idemhq/idem/kafkaauth",
	"outbox": "github.com/idemhq/idem/outbox", "saga": "github.com/idemhq/idem/saga",
	"schedule":   "github.com/idemhq/idem/schedule",
	"checkpoint": "github.com/idemhq/idem/checkpoint",
	"index":      "github.com/idemhq/idem/console/index",
	"console":    "github.com/idemhq/idem/console",
	"recovery":   "github.com/idemhq/idem/recovery",
	"serde":      "github.com/idemhq/idem/serde",
	"step":       "github.com/idemhq/idem/step",
	"idem":       "github.com/idemhq/idem",
}

// goLike tells a block meant as Go from a table, a shell session or SQL: a
// block that looks like Go must compile, whether or not it parses.
// pseudo marks a block as pseudo-code whatever else it holds: a line that
// starts with an SQL statement cannot be Go.
var pseudo = regexp.MustCompile(`^\s*(BEGIN|COMMIT|ROLLBACK|SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER)\b`)

var goLike = regexp.MustCompile(`:=|\bfunc\b|^\s*[a-z]\w*(\.\w+)+\(|^\s*\w+(,\s*\w+)*\s*=\s*[a-z]\w*\.[A-Z]\w*\(|^package `)

func repoRoot(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/idemhq/idem\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Fatal("repository root (go.mod of github.com/idemhq/idem) not found")
		}
		dir = parent
	}
}

// collect returns the Go snippets of every Markdown file and every package
// doc comment of the module (other modules, such as bench/, excluded).
func collect(tb testing.TB, root string) []snippet {
	tb.Helper()
	var out []snippet
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && rel != "." {
				return filepath.SkipDir // another module
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".md"):
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out = append(out, markdownSnippets(rel, string(b))...)
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go"):
			s, err := docSnippets(path, rel)
			if err != nil {
				return err
			}
			out = append(out, s...)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// markdownSnippets returns the ```go blocks of a Markdown file.
func markdownSnippets(rel, text string) []snippet {
	var out []snippet
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != "```go" {
			continue
		}
		start := i + 1
		var b strings.Builder
		for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
			b.WriteString(lines[i])
			b.WriteByte('\n')
		}
		out = append(out, snippet{where: fmt.Sprintf("%s:%d", rel, start+1), code: b.String()})
	}
	return chain(out)
}

// chain gives each snippet of one document the statement blocks before it.
func chain(ss []snippet) []snippet {
	var before []string
	for i := range ss {
		ss[i].before = append([]string(nil), before...)
		if isStatements(ss[i].code) {
			before = append(before, ss[i].code)
		}
	}
	return ss
}

func parses(src string) bool {
	_, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
	return err == nil
}

func isStatements(code string) bool {
	return !parses(code) && !parses("package p\n"+code) && parses("package p\nfunc _() {\n"+code+"\n}")
}

// docSnippets returns the code blocks of a package doc comment that look
// like Go.
func docSnippets(path, rel string) ([]snippet, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", rel, err)
	}
	if f.Doc == nil {
		return nil, nil
	}
	var p comment.Parser
	var out []snippet
	for _, b := range p.Parse(f.Doc.Text()).Content {
		c, ok := b.(*comment.Code)
		if !ok {
			continue
		}
		looksGo, sql := false, false
		for _, l := range strings.Split(c.Text, "\n") {
			looksGo = looksGo || goLike.MatchString(l)
			sql = sql || pseudo.MatchString(l)
		}
		looksGo = looksGo && !sql
		if looksGo {
			out = append(out, snippet{where: fmt.Sprintf("%s:%d (package doc)", rel, fset.Position(f.Doc.Pos()).Line), code: c.Text})
		}
	}
	return chain(out), nil
}

// source turns a snippet into a Go file of package snippet (or the
// snippet's own package clause when it has one).
func source(s snippet) (string, error) {
	if parses(s.code) { // a whole file, package clause and all
		return s.code, nil
	}
	var body string
	if _, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+s.code, 0); err == nil {
		body = s.code // declarations
	} else if _, err2 := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+s.code+"\n}", 0); err2 == nil {
		body = statements(s)
	} else {
		return "", fmt.Errorf("neither declarations nor statements:\n  as declarations: %v\n  as statements: %v", err, err2)
	}
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+body, 0)
	if err != nil {
		return "", err
	}
	use := map[string]bool{}
	for _, p := range givenImports {
		use[p] = true
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && imports[id.Name] != "" {
				use[imports[id.Name]] = true
			}
		}
		return true
	})
	paths := make([]string, 0, len(use))
	for p := range use {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var b strings.Builder
	b.WriteString("package snippet\n\nimport (\n")
	for _, p := range paths {
		b.WriteString("\t" + strconv.Quote(p) + "\n")
	}
	if !strings.HasPrefix(body, "func _() {") {
		body = "//line snippet.go:1\n" + body
	}
	b.WriteString(")\n" + givens + "\n" + body)
	return b.String(), nil
}

// statements wraps a block of statements, after the earlier ones of its
// document, in a function. Names a block declares at its top level may go
// unused (a fragment shows how a value is made, not all its uses): each is
// used once after it.
func statements(s snippet) string {
	var b strings.Builder
	b.WriteString("func _() {\n")
	for _, prev := range s.before {
		b.WriteString("//line earlier-block.go:1\n" + prev + "\n" + blanks(prev))
	}
	b.WriteString("//line snippet.go:1\n" + s.code + "\n" + blanks(s.code) + "}\n")
	return b.String()
}

// blanks returns "_ = name" for every name code declares at its top level.
func blanks(code string) string {
	f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+code+"\n}", 0)
	if err != nil {
		return ""
	}
	var names []string
	add := func(id *ast.Ident) {
		if id.Name != "_" {
			names = append(names, id.Name)
		}
	}
	for _, st := range f.Decls[0].(*ast.FuncDecl).Body.List {
		switch st := st.(type) {
		case *ast.AssignStmt:
			if st.Tok == token.DEFINE {
				for _, e := range st.Lhs {
					if id, ok := e.(*ast.Ident); ok {
						add(id)
					}
				}
			}
		case *ast.DeclStmt:
			if gd, ok := st.Decl.(*ast.GenDecl); ok && gd.Tok == token.VAR {
				for _, sp := range gd.Specs {
					for _, id := range sp.(*ast.ValueSpec).Names {
						add(id)
					}
				}
			}
		}
	}
	var b strings.Builder
	for _, n := range names {
		b.WriteString("_ = " + n + "\n")
	}
	return b.String()
}

// TestSnippetsCompile builds every Go snippet of the documentation in a
// temporary module that requires this repository through a replace
// directive, exactly as a user's code would import it.
func TestSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every documentation snippet; not in -short")
	}
	root := repoRoot(t)
	snippets := collect(t, root)
	if len(snippets) < 5 {
		t.Fatalf("found only %d snippets: the collector is broken", len(snippets))
	}
	dir := t.TempDir()
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod = bytes.Replace(mod, []byte("module github.com/idemhq/idem\n"), []byte("module idemsnippets\n"), 1)
	mod = append(mod, []byte(fmt.Sprintf("\nrequire github.com/idemhq/idem v0.0.0\n\nreplace github.com/idemhq/idem => %s\n", root))...)
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"go.mod": mod, "go.sum": sum} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Each snippet is built on its own (sNNN) and, when it is a block of
	// statements after others of its document, also as their continuation
	// (sNNNc); it passes when either builds.
	byDir := map[string]snippet{}
	write := func(d string, s snippet) {
		src, err := source(s)
		if err != nil {
			t.Errorf("%s: %v\n%s", s.where, err, s.code)
			return
		}
		byDir[d] = s
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, d, "snippet.go"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range snippets {
		alone := s
		alone.before = nil
		write(fmt.Sprintf("s%03d", i), alone)
		if len(s.before) > 0 && isStatements(s.code) {
			write(fmt.Sprintf("s%03dc", i), s)
		}
	}
	cmd := exec.Command("go", "build", "-o", os.DevNull, "./...")
	cmd.Dir = dir
	// Offline: every module is already in the cache (the repository's own
	// build needs the same ones), and go.sum is the repository's.
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -mod=mod"), "GOPROXY=off")
	out, err := cmd.CombinedOutput()
	if err == nil {
		if !t.Failed() {
			t.Logf("%d snippets compile", len(snippets))
		}
		return
	}
	// Name each failing snippet by where it is in the documentation.
	failed := map[string][]string{}
	var d string
	for _, line := range strings.Split(string(out), "\n") {
		if pkg, ok := strings.CutPrefix(line, "# idemsnippets/"); ok {
			d = pkg
		} else if d != "" && strings.TrimSpace(line) != "" {
			failed[d] = append(failed[d], strings.TrimSpace(line))
		}
	}
	if len(failed) == 0 {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for i := range snippets {
		d := fmt.Sprintf("s%03d", i)
		errs, bad := failed[d]
		if !bad {
			continue
		}
		if _, chained := byDir[d+"c"]; chained {
			cerrs, cbad := failed[d+"c"]
			if !cbad {
				continue // it compiles as the continuation of the blocks before it
			}
			errs = append(append(errs, "as the continuation of the blocks before it:"), cerrs...)
		}
		s := byDir[d]
		t.Errorf("%s: the snippet does not compile:\n  %s\n%s", s.where, strings.Join(errs, "\n  "), numbered(s.code))
	}
}

func numbered(code string) string {
	var b strings.Builder
	for i, l := range strings.Split(strings.TrimRight(code, "\n"), "\n") {
		fmt.Fprintf(&b, "%4d| %s\n", i+1, l)
	}
	return b.String()
}

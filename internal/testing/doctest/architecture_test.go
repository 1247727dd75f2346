package doctest

import (
	"flag"
	"fmt"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/architecture.md's package map from the package docs")

// The package map of docs/architecture.md sits between these two lines.
const (
	mapStart = "<!-- package map: generated from each package's doc by TestArchitectureMap (internal/testing/doctest); run `go test ./internal/testing/doctest -run TestArchitectureMap -update` after adding, moving or re-documenting a package -->"
	mapEnd   = "<!-- end of package map -->"
)

// TestArchitectureMap keeps docs/architecture.md's package map equal to the
// module's packages: one line per package, its path and the first sentence
// of its package doc, grouped as public packages, commands and examples,
// product internals and the test harness (internal/testing/); a product
// internal's doc starts "Package x is". A package
// added, moved, removed or re-documented fails it until the map is
// regenerated with -update.
func TestArchitectureMap(t *testing.T) {
	root := repoRoot(t)
	want := packageMap(t, root)
	path := filepath.Join(root, "docs", "architecture.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i, j := strings.Index(text, mapStart+"\n"), strings.Index(text, mapEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/architecture.md: the package map's markers are missing:\n%s\n%s", mapStart, mapEnd)
	}
	got := text[i+len(mapStart)+1 : j]
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(path, []byte(text[:i+len(mapStart)+1]+want+text[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for _, l := range wl {
		if !slices.Contains(gl, l) {
			t.Errorf("docs/architecture.md lacks: %s", l)
		}
	}
	for _, l := range gl {
		if !slices.Contains(wl, l) {
			t.Errorf("docs/architecture.md has, but no package says: %s", l)
		}
	}
	t.Errorf("docs/architecture.md's package map is out of date: run go test ./internal/testing/doctest -run TestArchitectureMap -update")
}

// packageMap returns the package map of the module at root, in Markdown.
func packageMap(tb testing.TB, root string) string {
	tb.Helper()
	groups := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && rel != "." {
			return filepath.SkipDir // another module
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		var pkg, text string
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(path, e.Name()), nil, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			pkg = f.Name.Name
			if f.Doc != nil && text == "" {
				text = f.Doc.Text()
			}
		}
		if pkg == "" {
			return nil
		}
		name := filepath.ToSlash(rel)
		if name == "." {
			name = "github.com/idemhq/idem (root)"
		}
		synopsis := new(doc.Package).Synopsis(text)
		if synopsis == "" {
			tb.Errorf("%s: package %s has no package doc", name, pkg)
		}
		// An internal package answers "what is this?" in one noun phrase
		// (issue 32, item 1): its doc says what it is, not what it does.
		if group(name) == "Product internals" && !strings.HasPrefix(synopsis, "Package "+pkg+" is ") {
			tb.Errorf("%s: the package doc starts %.40q…; an internal package's says what it is: \"Package %s is …\"", name, synopsis, pkg)
		}
		groups[group(name)] = append(groups[group(name)], fmt.Sprintf("- `%s`: %s", name, synopsis))
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	var b strings.Builder
	for _, g := range []string{"Public packages", "Commands and examples", "Product internals", "Test harness"} {
		fmt.Fprintf(&b, "\n### %s\n\n", g)
		slices.Sort(groups[g])
		for _, l := range groups[g] {
			b.WriteString(l + "\n")
		}
	}
	b.WriteString("\n")
	return b.String()
}

// group names the section of the package map that the package at the
// module-relative path rel belongs to.
func group(rel string) string {
	switch {
	case strings.HasPrefix(rel, "internal/testing/"):
		return "Test harness"
	case strings.HasPrefix(rel, "internal/") || strings.Contains(rel, "/internal/"):
		return "Product internals"
	case strings.HasPrefix(rel, "cmd/") || strings.HasPrefix(rel, "examples/") || rel == "scripts":
		return "Commands and examples"
	default:
		return "Public packages"
	}
}

// Package apicount counts the exported identifiers of idem's public API:
// scripts/exported.go prints the counts and where each name is used, and
// the root package's TestExportedSurface bounds the total. It reads the
// source as text (go/parser); it builds nothing.
//
// The public packages are every package of the module that a user can
// import: not internal/, not a command or an example, not scripts/, not
// another module such as bench/. Test files are left out.
package apicount

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Module is the import path of the module whose API is counted.
const Module = "github.com/idemhq/idem"

// Counts is what one package, or the whole API, exports: top-level names
// (functions, types, variables, constants), methods of exported types,
// and fields and interface methods of exported types.
type Counts struct{ Top, Methods, Fields int }

// Total is Top + Methods + Fields.
func (c Counts) Total() int { return c.Top + c.Methods + c.Fields }

// Package is one public package's count and its exported names ("Name",
// "Type.Method", "Type.Field"), sorted.
type Package struct {
	Dir string // relative to the module root; "." for the root package
	Counts
	Names []string
}

// Count returns the public packages under root (the module's directory),
// sorted by directory, and their sum.
func Count(root string) ([]Package, Counts, error) {
	pkgs := map[string]*Package{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			base := d.Name()
			if rel != "." && (strings.HasPrefix(base, ".") || base == "testdata" || base == "internal" || base == "examples" || base == "cmd" || base == "scripts") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && rel != "." {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" || hasIgnoreTag(f) {
			return nil
		}
		dir := filepath.Dir(rel)
		p := pkgs[dir]
		if p == nil {
			p = &Package{Dir: dir}
			pkgs[dir] = p
		}
		add := func(n *int, name string) {
			*n++
			p.Names = append(p.Names, name)
		}
		for _, id := range topLevel(f) {
			if id.IsExported() {
				add(&p.Top, id.Name)
			}
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil || !decl.Name.IsExported() {
					continue
				}
				if recv := recvType(decl.Recv.List[0].Type); ast.IsExported(recv) {
					add(&p.Methods, recv+"."+decl.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					spec, ok := spec.(*ast.TypeSpec)
					if !ok || !spec.Name.IsExported() {
						continue
					}
					var list *ast.FieldList
					switch t := spec.Type.(type) {
					case *ast.StructType:
						list = t.Fields
					case *ast.InterfaceType:
						list = t.Methods
					}
					if list == nil {
						continue
					}
					for _, fld := range list.List {
						for _, n := range fld.Names {
							if n.IsExported() {
								add(&p.Fields, spec.Name.Name+"."+n.Name)
							}
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, Counts{}, err
	}
	out := make([]Package, 0, len(pkgs))
	var sum Counts
	for _, p := range pkgs {
		sort.Strings(p.Names)
		out = append(out, *p)
		sum.Top += p.Top
		sum.Methods += p.Methods
		sum.Fields += p.Fields
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dir < out[j].Dir })
	return out, sum, nil
}

// topLevel returns the names f declares at top level, exported or not:
// functions (not methods), variables, constants and types.
func topLevel(f *ast.File) []*ast.Ident {
	var out []*ast.Ident
	for _, decl := range f.Decls {
		switch decl := decl.(type) {
		case *ast.FuncDecl:
			if decl.Recv == nil {
				out = append(out, decl.Name)
			}
		case *ast.GenDecl:
			for _, spec := range decl.Specs {
				switch spec := spec.(type) {
				case *ast.ValueSpec:
					out = append(out, spec.Names...)
				case *ast.TypeSpec:
					out = append(out, spec.Name)
				}
			}
		}
	}
	return out
}

// recvType is the name of a method's receiver type, pointer and type
// parameters left out.
func recvType(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvType(t.X)
	case *ast.IndexExpr:
		return recvType(t.X)
	case *ast.IndexListExpr:
		return recvType(t.X)
	case *ast.Ident:
		return t.Name
	}
	return ""
}

// hasIgnoreTag reports whether the file is built only with the ignore tag
// (a script such as scripts/exported.go).
func hasIgnoreTag(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if strings.HasPrefix(c.Text, "//go:build") && strings.Contains(c.Text, "ignore") {
				return true
			}
		}
	}
	return false
}

// A declared name is one exported top-level name of a public package.
type declared struct {
	pkg  string // directory, relative to the root ("." for the root package)
	name string
}

// Ref says where one exported top-level name is referenced.
type Ref struct {
	// Name is "pkg.Name", the root package's names as "idem.Name".
	Name string
	// Where lists, in this order, those of "own" (its own package), "owntest"
	// (the package's own internal tests), "idem" (another package of the
	// module outside consumer/ and examples/: cmd/, internal/, the other
	// public packages, bench/), "test" (another _test.go file, the
	// package's external tests included), "consumer" and "examples" (any
	// file, tests included), "md" (a Markdown page: README.md, docs/) that
	// reference it; "-" when none does.
	Where []string
}

// Refs returns, per public package and exported top-level name, where the
// name is referenced, sorted by package and name. References are found
// syntactically: pkg.Name through an import of the package (its local
// name), a bare Name in another file or declaration of the package itself,
// and pkg.Name in Markdown. That over-counts at worst (a field or method of
// the same name in the own package), so a name it calls unused outside its
// package is.
func Refs(root string) ([]Ref, error) {
	decls := map[declared]map[string]bool{} // name -> set of where
	public := map[string]bool{}             // public package dirs
	type file struct {
		rel string
		f   *ast.File
	}
	var files []file
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if hasIgnoreTag(f) {
			return nil
		}
		files = append(files, file{rel, f})
		return nil
	})
	if err != nil {
		return nil, err
	}
	isPublic := func(dir string) bool {
		for _, p := range strings.Split(dir, string(filepath.Separator)) {
			if p == "internal" || p == "examples" || p == "cmd" || p == "scripts" || p == "bench" || p == "deploy" || p == "tools" {
				return false
			}
		}
		return true
	}
	// The declarations of the public packages.
	for _, fl := range files {
		dir := filepath.Dir(fl.rel)
		if !isPublic(dir) || strings.HasSuffix(fl.rel, "_test.go") || fl.f.Name.Name == "main" {
			continue
		}
		public[dir] = true
		for _, id := range topLevel(fl.f) {
			if id.IsExported() {
				decls[declared{dir, id.Name}] = map[string]bool{}
			}
		}
	}
	where := func(rel string) string {
		switch {
		case strings.HasPrefix(rel, "consumer"+string(filepath.Separator)):
			return "consumer"
		case strings.HasPrefix(rel, "examples"+string(filepath.Separator)):
			return "examples"
		case strings.HasSuffix(rel, "_test.go"):
			return "test"
		}
		return "idem"
	}
	for _, fl := range files {
		dir := filepath.Dir(fl.rel)
		ownPkg := public[dir] && !strings.HasSuffix(fl.f.Name.Name, "_test")
		// Local names of the imported public packages.
		local := map[string]string{}
		for _, imp := range fl.f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path != Module && !strings.HasPrefix(path, Module+"/") {
				continue
			}
			pdir := strings.TrimPrefix(strings.TrimPrefix(path, Module), "/")
			if pdir == "" {
				pdir = "."
			}
			if !public[pdir] {
				continue
			}
			name := filepath.Base(path)
			if pdir == "." {
				name = "idem"
			}
			if imp.Name != nil {
				name = imp.Name.Name
			}
			local[name] = pdir
		}
		// Declared names of this file, so that a declaration is not its
		// own reference.
		self := map[*ast.Ident]bool{}
		for _, id := range topLevel(fl.f) {
			self[id] = true
		}
		ast.Inspect(fl.f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok {
					if pdir, ok := local[x.Name]; ok {
						if set := decls[declared{pdir, n.Sel.Name}]; set != nil {
							set[where(fl.rel)] = true
						}
						return false
					}
				}
			case *ast.Ident:
				if ownPkg && !self[n] {
					if set := decls[declared{dir, n.Name}]; set != nil {
						if strings.HasSuffix(fl.rel, "_test.go") {
							set["owntest"] = true
						} else {
							set["own"] = true
						}
					}
				}
			}
			return true
		})
	}
	// Markdown pages: pkg.Name as text.
	ref := regexp.MustCompile(`\b([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)`)
	_ = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".md") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if strings.HasPrefix(rel, ".") || strings.Contains(rel, "node_modules") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		for _, m := range ref.FindAllSubmatch(b, -1) {
			pkg := string(m[1])
			for dir := range public {
				base := filepath.Base(dir)
				if dir == "." {
					base = "idem"
				}
				if base == pkg {
					if set := decls[declared{dir, string(bytes.Clone(m[2]))}]; set != nil {
						set["md"] = true
					}
				}
			}
		}
		return nil
	})
	keys := make([]declared, 0, len(decls))
	for k := range decls {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].pkg != keys[j].pkg {
			return keys[i].pkg < keys[j].pkg
		}
		return keys[i].name < keys[j].name
	})
	order := []string{"own", "owntest", "idem", "test", "consumer", "examples", "md"}
	out := make([]Ref, 0, len(keys))
	for _, k := range keys {
		var w []string
		for _, o := range order {
			if decls[k][o] {
				w = append(w, o)
			}
		}
		if len(w) == 0 {
			w = []string{"-"}
		}
		pkg := k.pkg
		if pkg == "." {
			pkg = "idem" // the root package
		}
		out = append(out, Ref{Name: pkg + "." + k.name, Where: w})
	}
	return out, nil
}

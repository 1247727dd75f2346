//go:build ignore

// Command exported counts the exported identifiers of idem's public API: in
// every package of the module that a user can import (not internal/, not
// a command or an example, not another module such as bench/), the
// exported top-level names (functions, types, variables, constants), the
// exported methods of exported types, and the exported fields and
// interface methods of exported types. Test files are left out.
//
//	go run scripts/exported.go [-v] [-refs] [module root]
//
// It prints one line per package (top-level, methods, fields, total) and
// the totals; -v also lists every name.
//
// With -refs it prints instead, for every exported top-level name, where
// it is referenced: "own" (its own package), "owntest" (the package's own
// internal tests), "idem" (another package of the module outside consumer/
// and examples/: cmd/, internal/, the other public packages, bench/),
// "consumer" and "examples" (any file, tests included), "test" (another
// _test.go file, the package's external tests included), "md" (a Markdown
// page: README.md, docs/). A name used by no example, no consumer file and no page is a
// candidate to move to internal/ or to unexport; a name used by none at
// all outside its package can simply be unexported. For example, the
// candidates, and the idem-only names consumer/ still holds:
//
//	go run scripts/exported.go -refs | awk -F'\t' '$2 !~ /consumer|examples|md/'
//	go run scripts/exported.go -refs | awk -F'\t' '$2 ~ /consumer/ && $2 !~ /examples|md/'
package main

import (
	"bytes"
	"flag"
	"fmt"
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

type counts struct{ top, methods, fields int }

func (c counts) total() int { return c.top + c.methods + c.fields }

func main() {
	verbose := flag.Bool("v", false, "list every exported name")
	refs := flag.Bool("refs", false, "list where each exported top-level name is referenced")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	if *refs {
		if err := printRefs(root); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	pkgs := map[string]counts{}
	names := map[string][]string{}
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
		pkg := filepath.Dir(rel)
		c := pkgs[pkg]
		add := func(n *int, name string) {
			*n++
			names[pkg] = append(names[pkg], name)
		}
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if !decl.Name.IsExported() {
					continue
				}
				if decl.Recv == nil {
					add(&c.top, decl.Name.Name)
				} else if recv := recvType(decl.Recv.List[0].Type); ast.IsExported(recv) {
					add(&c.methods, recv+"."+decl.Name.Name)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							if n.IsExported() {
								add(&c.top, n.Name)
							}
						}
					case *ast.TypeSpec:
						if !spec.Name.IsExported() {
							continue
						}
						add(&c.top, spec.Name.Name)
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
									add(&c.fields, spec.Name.Name+"."+n.Name)
								}
							}
						}
					}
				}
			}
		}
		pkgs[pkg] = c
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	keys := make([]string, 0, len(pkgs))
	for k := range pkgs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sum counts
	fmt.Printf("%-22s %5s %7s %6s %5s\n", "package", "top", "methods", "fields", "total")
	for _, k := range keys {
		c := pkgs[k]
		fmt.Printf("%-22s %5d %7d %6d %5d\n", k, c.top, c.methods, c.fields, c.total())
		if *verbose {
			sort.Strings(names[k])
			fmt.Printf("  %s\n", strings.Join(names[k], " "))
		}
		sum.top += c.top
		sum.methods += c.methods
		sum.fields += c.fields
	}
	fmt.Printf("%-22s %5d %7d %6d %5d\n", "all", sum.top, sum.methods, sum.fields, sum.total())
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
// (a script such as this one).
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

// module is the import path of the module whose API is counted.
const module = "github.com/idemhq/idem"

// A declared name is one exported top-level name of a public package.
type declared struct {
	pkg  string // directory, relative to the root ("." for the root package)
	name string
}

// printRefs prints, per public package and exported top-level name, where
// the name is referenced. References are found syntactically: pkg.Name
// through an import of the package (its local name), a bare Name in
// another file or declaration of the package itself, and pkg.Name in
// Markdown. That over-counts at worst (a field or method of the same name
// in the own package), so a name it calls unused outside its package is.
func printRefs(root string) error {
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
		return err
	}
	isPublic := func(dir string) bool {
		top := strings.Split(dir, string(filepath.Separator))
		for _, p := range top {
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
		for _, decl := range fl.f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil && decl.Name.IsExported() {
					decls[declared{dir, decl.Name.Name}] = map[string]bool{}
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							if n.IsExported() {
								decls[declared{dir, n.Name}] = map[string]bool{}
							}
						}
					case *ast.TypeSpec:
						if spec.Name.IsExported() {
							decls[declared{dir, spec.Name.Name}] = map[string]bool{}
						}
					}
				}
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
			if path != module && !strings.HasPrefix(path, module+"/") {
				continue
			}
			pdir := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
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
		for _, decl := range fl.f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv == nil {
					self[decl.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							self[n] = true
						}
					case *ast.TypeSpec:
						self[spec.Name] = true
					}
				}
			}
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
		fmt.Printf("%s.%s\t%s\n", pkg, k.name, strings.Join(w, ","))
	}
	return nil
}

//go:build ignore

// Command exported counts the exported identifiers of idem's public API: in
// every package of the module that a user can import (not internal/, not
// a command or an example, not another module such as bench/), the
// exported top-level names (functions, types, variables, constants), the
// exported methods of exported types, and the exported fields and
// interface methods of exported types. Test files are left out.
//
//	go run scripts/exported.go [-v] [module root]
//
// It prints one line per package (top-level, methods, fields, total) and
// the totals; -v also lists every name.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type counts struct{ top, methods, fields int }

func (c counts) total() int { return c.top + c.methods + c.fields }

func main() {
	verbose := flag.Bool("v", false, "list every exported name")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
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

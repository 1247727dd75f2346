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
//
// The counting is internal/testing/apicount's, which the root package's
// TestExportedSurface also uses to bound the API.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/idemhq/idem/internal/testing/apicount"
)

func main() {
	verbose := flag.Bool("v", false, "list every exported name")
	refs := flag.Bool("refs", false, "list where each exported top-level name is referenced")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	if *refs {
		rs, err := apicount.Refs(root)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		for _, r := range rs {
			fmt.Printf("%s\t%s\n", r.Name, strings.Join(r.Where, ","))
		}
		return
	}
	pkgs, sum, err := apicount.Count(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%-22s %5s %7s %6s %5s\n", "package", "top", "methods", "fields", "total")
	for _, p := range pkgs {
		fmt.Printf("%-22s %5d %7d %6d %5d\n", p.Dir, p.Top, p.Methods, p.Fields, p.Total())
		if *verbose {
			fmt.Printf("  %s\n", strings.Join(p.Names, " "))
		}
	}
	fmt.Printf("%-22s %5d %7d %6d %5d\n", "all", sum.Top, sum.Methods, sum.Fields, sum.Total())
}

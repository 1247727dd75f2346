//go:build idem_mutate

package mutate

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
)

// on is the names in IDEM_MUTATE, read once.
var on = sync.OnceValue(func() []string {
	var names []string
	for _, n := range strings.Split(os.Getenv(Env), ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if !slices.Contains(Names, n) {
			fmt.Fprintf(os.Stderr, "mutate: %s=%q: unknown switch %q (known: %s)\n", Env, os.Getenv(Env), n, strings.Join(Names, ", "))
			os.Exit(2)
		}
		names = append(names, n)
	}
	if len(names) > 0 {
		fmt.Fprintf(os.Stderr, "mutate: mechanisms switched off: %s\n", strings.Join(names, ", "))
	}
	return names
})

// On reports whether mechanism name is switched off: named in the
// environment variable IDEM_MUTATE (read once; an unknown name there ends
// the process with status 2).
func On(name string) bool { return slices.Contains(on(), name) }

package awsmsk_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocShowsTheExample: the MSK block of docs/secured-clusters.md (a
// plain fence: idem's doc test compiles Go blocks in idem's module, which
// does not have this one) is the body of Example, line for line, so what
// the page shows compiles here.
func TestDocShowsTheExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/secured-clusters.md")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	lines := func(s string) []string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	_, section, ok := strings.Cut(string(doc), "## Amazon MSK (IAM)")
	if !ok {
		t.Fatal("docs/secured-clusters.md has no section \"Amazon MSK (IAM)\"")
	}
	_, block, ok := strings.Cut(section, "\n```\n")
	if !ok {
		t.Fatal("the MSK section has no code block")
	}
	block, _, _ = strings.Cut(block, "\n```")
	want := strings.Join(lines(block), "\n")
	if len(want) < 100 || !strings.Contains(strings.Join(lines(string(ex)), "\n"), want) {
		t.Fatalf("the MSK block of docs/secured-clusters.md is not in example_test.go's Example:\n%s", want)
	}
}

package doctest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// mdLink matches an inline Markdown link or image, [text](target) or
// ![alt](target), with an optional "title" after the target.
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// htmlAnchor matches an explicit anchor, <a id="x"> or <a name="x">.
var htmlAnchor = regexp.MustCompile(`<a\s+(?:id|name)="([^"]+)"`)

// codeSpan matches inline code, whose brackets are not links.
var codeSpan = regexp.MustCompile("`[^`]*`")

// linkedDocs are the Markdown files whose links must resolve: the README,
// the guides under docs/, and the contributor's and change logs.
func linkedDocs(tb testing.TB, root string) []string {
	tb.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, _ := filepath.Rel(root, path)
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return files
}

// links returns the link targets of a Markdown text with the line each is
// on, leaving out fenced code blocks and inline code.
func links(text string) (targets []string, lines []int) {
	for i, line := range prose(text) {
		for _, m := range mdLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			targets = append(targets, m[1])
			lines = append(lines, i+1)
		}
	}
	return targets, lines
}

// prose returns the lines of a Markdown text with those of fenced code
// blocks (fences included) blanked, so that line numbers still count.
func prose(text string) []string {
	lines := strings.Split(text, "\n")
	fenced := false
	for i, line := range lines {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			lines[i] = ""
		} else if fenced {
			lines[i] = ""
		}
	}
	return lines
}

// anchors returns the anchors a Markdown text defines: GitHub's slug of
// every heading (a second heading of the same slug gets "-1", and so on)
// and every explicit <a id> or <a name>.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, line := range prose(text) {
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			out[m[1]] = true
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		slug := slugify(heading)
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// slugify is GitHub's heading anchor: lower case, punctuation dropped
// (hyphens and underscores kept), spaces to hyphens.
func slugify(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// TestLinksResolve: every relative link of the README, the guides under
// docs/, CONTRIBUTING.md and CHANGELOG.md names a file or folder of the
// repository, and every #anchor into a Markdown file names one of its
// headings or explicit anchors.
func TestLinksResolve(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	for _, rel := range linkedDocs(t, root) {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if os.IsNotExist(err) {
			t.Errorf("%s does not exist", rel)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		targets, lines := links(string(b))
		for i, target := range targets {
			where := fmt.Sprintf("%s:%d", rel, lines[i])
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			file := filepath.Join(root, rel)
			if path != "" {
				file = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
				if !strings.HasPrefix(file, root+string(filepath.Separator)) && file != root {
					t.Errorf("%s: %s leaves the repository", where, target)
					continue
				}
				if _, err := os.Stat(file); err != nil {
					t.Errorf("%s: %s: no such file or folder", where, target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			doc, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("%s: %s: %v", where, target, err)
				continue
			}
			if !anchors(string(doc))[anchor] {
				t.Errorf("%s: %s: no heading or anchor %q in %s", where, target, anchor, filepath.Base(file))
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked only %d links: the scanner is broken", checked)
	}
	t.Logf("%d relative links resolve", checked)
}

// TestSlugify pins the anchors GitHub gives headings the guides link to.
func TestSlugify(t *testing.T) {
	for heading, want := range map[string]string{
		"DLQ triage with `idem dlq`":            "dlq-triage-with-idem-dlq",
		"Secured clusters (TLS, SASL)":          "secured-clusters-tls-sasl",
		"What can go wrong, and what idem does": "what-can-go-wrong-and-what-idem-does",
		"Time: deferring a message":             "time-deferring-a-message",
		"Deferring: `handler.DeferUntil`":       "deferring-handlerdeferuntil",
		"Known gap: idem's start":               "known-gap-idems-start",
		"Performance at 1,000,000 records":      "performance-at-1000000-records",
		"Measured (2-core machine, load 8–10)":  "measured-2-core-machine-load-810",
	} {
		if got := slugify(heading); got != want {
			t.Errorf("slugify(%q) = %q, want %q", heading, got, want)
		}
	}
}

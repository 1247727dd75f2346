package doctest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestMarkdownStructure reads the README, the guides under docs/ and the
// contributor's and change logs as a reader would and fails on text that
// is broken as text, which a renderer shows without complaint:
//
//   - a heading in the middle of a sentence: the paragraph before it stops
//     without the punctuation that ends a sentence or announces a list, a
//     table or code (. : ! ? and a closing bracket or quote after one);
//   - a stray fragment: a paragraph right after a heading that starts in
//     the middle of a sentence (with a lower-case word: "and `idem dlq
//     replay`.").
func TestMarkdownStructure(t *testing.T) {
	root := repoRoot(t)
	for _, rel := range linkedDocs(t, root) {
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range structureProblems(string(b)) {
			t.Errorf("%s:%s", rel, p)
		}
	}
}

// TestStructureProblems: the check finds the breaks docs/cli.md once had,
// and passes what the docs write on purpose.
func TestStructureProblems(t *testing.T) {
	broken := "Commands that talk\nto Kafka (`dlq …`, `topic create`,\n\n## Connection flags\n\n`produce`) take the flags.\n\n" +
		"## Dead letters\n\nand `idem dlq replay`.\n"
	if got := structureProblems(broken); len(got) != 2 || !strings.Contains(got[0], "mid-sentence") || !strings.Contains(got[1], "fragment") {
		t.Errorf("the broken text: %q, want a heading mid-sentence and a stray fragment", got)
	}
	fine := "# Title\n\nidem is a name.\n\n## Next\n\n- a list item\n- another\n\n## Table\n\n| a | b |\n|---|---|\n\n" +
		"## Code\n\n```sh\nidem dlq list\n```\n\n## Lead-in\n\nAs follows:\n\n1. one\n\n## Quote\n\nIt says \"done.\"\n\n## Image\n\n![x](y.png)\n\n" +
		"## Code first\n\n`idem console` serves it.\n\n## Possessive\n\nidem's inbox holds it.\n\n<!-- a comment -->\n\n## End\n"
	if got := structureProblems(fine); len(got) != 0 {
		t.Errorf("well-formed text: %q, want nothing", got)
	}
}

var (
	headingLine = regexp.MustCompile(`^#{1,6} `)
	// notProse starts a line that is no sentence of a paragraph: a list
	// item, a table row, a quote, HTML, an image, a heading, a rule, or an
	// indented line (a list item's continuation, indented code).
	notProse = regexp.MustCompile(`^(\s|[-*+] |\d+[.)] |\||>|<|!\[|#|---|\*\*\*|___|\[\^?[^\]]*\]:)`)
)

// structureProblems returns "line: problem" for each break TestMarkdownStructure
// looks for in text.
func structureProblems(text string) []string {
	var out []string
	lines := prose(text)
	prevLine := func(i int) (string, int) {
		for j := i - 1; j >= 0; j-- {
			if strings.TrimSpace(lines[j]) != "" {
				return lines[j], j
			}
		}
		return "", -1
	}
	fenced := strings.Split(text, "\n") // to tell a blanked fence from a blank line
	for i, line := range lines {
		if !headingLine.MatchString(line) {
			continue
		}
		if before, j := prevLine(i); j >= 0 && !blankedFence(fenced, j, i) && !notProse.MatchString(before) && !endsSentence(before) {
			out = append(out, fmt.Sprintf("%d: a heading mid-sentence: the paragraph before it stops at %q", i+1, tail(before)))
		}
		for j := i + 1; j < len(lines); j++ {
			next := lines[j]
			if strings.TrimSpace(next) == "" {
				if strings.TrimSpace(fenced[j]) != "" {
					break // a code block
				}
				continue
			}
			if r, _ := utf8.DecodeRuneInString(next); unicode.IsLower(r) && !notProse.MatchString(next) && !aName(next) {
				out = append(out, fmt.Sprintf("%d: a stray fragment after the heading %q: %q", j+1, strings.TrimSpace(line), head(next)))
			}
			break
		}
	}
	return out
}

// aName reports whether a line starts with a name written in lower case on
// purpose (idem itself, also as "idem's", sarama, pgx/v5, franz-go: a word
// that is idem or holds a digit, a dot, a dash or a slash), not a
// sentence's middle.
func aName(line string) bool {
	word, _, _ := strings.Cut(line, " ")
	return word == "idem" || word == "idem's" || word == "idem’s" || strings.ContainsAny(word, "0123456789.-/") || strings.ContainsAny(word, "_")
}

// blankedFence reports whether a fenced code block lies between lines j
// and i of the original text (prose blanked it).
func blankedFence(orig []string, j, i int) bool {
	for k := j + 1; k < i; k++ {
		if strings.HasPrefix(strings.TrimSpace(orig[k]), "```") {
			return true
		}
	}
	return false
}

// endsSentence reports whether a line of prose ends a sentence or announces
// what follows.
func endsSentence(line string) bool {
	s := strings.TrimRight(line, " \t")
	s = strings.TrimRight(s, `"')]*_`+"`”’")
	if s == "" {
		return true
	}
	r, _ := utf8.DecodeLastRuneInString(s)
	return strings.ContainsRune(".:!?…", r)
}

func tail(s string) string {
	if len(s) > 40 {
		return "…" + s[len(s)-40:]
	}
	return s
}

func head(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

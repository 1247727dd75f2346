// Package doctest holds the test that keeps idem's documentation honest:
// every Go snippet in the repository's Markdown files (```go blocks) and in
// its package doc comments must compile against the current code. See
// snippets_test.go for how fragments are wrapped and which names a snippet
// may use without declaring them.
package doctest

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/retrytopic"
)

func newDLQCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "dlq <command>",
		Short: "Inspect, replay and purge dead-letter topics",
		Long: `Inspect, replay and purge dead-letter topics.

Name the dead-letter topic with --topic (-t), or with --source and --group:
the topic and consumer group whose dead-letter topic it is, by idem's default
name <topic>.<group>.dlq (give --topic when Retry.Tiers.DLQTopic renames it).

Two views of what is pending; every command's answer starts with the one it
shows ("view: failure index" or "view: topic T"):

With --database-url (or DATABASE_URL), list, show, replay, resolve and
archive work on the failure index that idem console's indexer keeps in
PostgreSQL: each dead letter has its own status (unresolved, replaying,
replayed, resolved, archived), a replay of a subset leaves the others
unresolved, and every action is written to the audit log under the OS user
(and --actor). An index that holds no record of a topic that has pending
dead letters is an error, not an empty answer. A replay claims its records
and runs as a job: see dlq jobs.

Without a database, or with --from-topic, pending records are those past the
committed offsets of the consumer group "<dlq-topic>.admin". replay and purge
move that group forward; list, show and depth never change anything. depth
and purge always work this way. (A running indexer moves that group up to the
first record the index has not settled.)

Records are read as a read_committed consumer reads them: a topic written
with transactions holds markers and aborted records, which are no dead
letters.

A replay goes to each record's origin topic or one of its retry tiers for its
group (<origin>.<group>.retry.<n>); --replay-topic allows another.`,
		Example: `  idem dlq list --source payments --group billing
  idem dlq depth -t payments.billing.dlq --json
  idem dlq show -t payments.billing.dlq --partition 0 --offset 42
  idem dlq replay --source payments --group billing --filter kind=timeout --dry-run
  idem dlq purge -t payments.billing.dlq --yes
  idem dlq list --database-url postgres://idem@db/idem -t payments.billing.dlq
  idem dlq replay --database-url postgres://idem@db/idem --id 42 --id 43 --reason "ledger fixed"`,
	}
	a.kafkaFlags(c)
	a.dlqDBFlags(c)
	c.AddCommand(newListCmd(a), newShowCmd(a), newReplayCmd(a), newStatusCmd(a, "resolve"), newStatusCmd(a, "archive"),
		newPurgeCmd(a), newDepthCmd(a), newJobsCmd(a))
	return c
}

// dlqTopic is how a dlq command names its dead-letter topic: --topic, or
// --source and --group.
type dlqTopic struct {
	topic, source, group string
}

// dlqTopicFlags adds --topic/-t, --source and --group/-g to c.
func dlqTopicFlags(c *cobra.Command, t *dlqTopic) {
	c.Flags().StringVarP(&t.topic, "topic", "t", "", "dead-letter topic (or give --source and --group)")
	c.Flags().StringVar(&t.source, "source", "", "source topic whose dead-letter topic to use: <source>.<group>.dlq (with --group)")
	c.Flags().StringVarP(&t.group, "group", "g", "", "consumer group of --source")
}

// readFlags adds the flags of a command that reads a dead-letter topic and
// prints a table or JSON: dlqTopicFlags and --json.
func readFlags(c *cobra.Command, t *dlqTopic, asJSON *bool) {
	dlqTopicFlags(c, t)
	c.Flags().BoolVar(asJSON, "json", false, "print JSON instead of a table")
}

// name returns the dead-letter topic the flags name.
func (t dlqTopic) name() (string, error) {
	switch {
	case t.topic != "" && (t.source != "" || t.group != ""):
		return "", errors.New("give either --topic or --source with --group, not both")
	case t.topic != "":
		return t.topic, nil
	case t.source != "" && t.group != "":
		return retrytopic.Policy{}.DLQ(t.source, t.group), nil
	case t.source != "" || t.group != "":
		return "", errors.New("--source and --group go together: give both (or --topic)")
	default:
		return "", errors.New("no dead-letter topic: give --topic, or --source and --group")
	}
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// printable reports whether s is valid UTF-8 made only of printable runes
// (strconv.IsPrint: no control characters, no bidi or other format
// characters), and tabs when tabs is true.
func printable(s string, tabs bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !strconv.IsPrint(r) && (!tabs || r != '\t') {
			return false
		}
	}
	return true
}

// text renders one line of record data for a terminal: s itself when it is
// printable (no tabs, so table columns hold), else Go-quoted ("a\x1b[2J\xff"),
// so no control byte, invalid UTF-8 or bidi override reaches the terminal.
func text(s string) string {
	if printable(s, false) {
		return s
	}
	return strconv.Quote(s)
}

// block renders multi-line record data (a payload, a stack) as lines indented
// by two spaces: each line as it is when printable (tabs allowed), else
// Go-quoted.
func block(w io.Writer, s string) {
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if !printable(l, true) {
			l = strconv.Quote(l)
		}
		fmt.Fprintln(w, "  "+l)
	}
}

// truncate folds s onto one line, escapes it as text does, and cuts it to n
// runes.
func truncate(s string, n int) string {
	s = text(oneLine(s))
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// at renders a record position as PARTITION/OFFSET.
func at(partition int32, offset int64) string { return fmt.Sprintf("%d/%d", partition, offset) }

// plural renders "1 stub", "2 stubs".
func plural(n int64, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeJSON writes v as indented JSON in which every rune that is not
// printable (strconv.IsPrint: C1 controls, DEL, bidi and other format
// characters) is written as a \uXXXX escape: the same JSON value, safe on a
// terminal. (encoding/json already escapes the C0 controls.)
func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	b := buf.Bytes()
	out := make([]byte, 0, len(b)+1)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && size == 1:
			out = append(out, `\ufffd`...)
		case r == '\n' || strconv.IsPrint(r):
			out = append(out, b[:size]...)
		default:
			for _, u := range utf16.Encode([]rune{r}) {
				out = fmt.Appendf(out, `\u%04x`, u)
			}
		}
		b = b[size:]
	}
	_, err := w.Write(out)
	return err
}

package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/replayrec"
	"github.com/idemhq/idem/internal/wire"
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

func newListCmd(a *app) *cobra.Command {
	var sel dlqTopic
	var asJSON bool
	var filter, status string
	var limit int
	c := &cobra.Command{
		Use:   "list",
		Short: "Group pending dead-letter records by failure fingerprint",
		Long: `Group pending dead-letter records by failure fingerprint.

Without a database: the records past the admin group's offsets, by group,
with a sample's PARTITION/OFFSET (what show takes) and a count of stubs.
With --database-url: the failure index's groups, then its records (ID,
PARTITION/OFFSET, status, a stub mark), filtered by --filter and --status.`,
		Example: `  idem dlq list -t payments.billing.dlq
  idem dlq list --source payments --group billing --json
  idem dlq list --database-url postgres://idem@db/idem --filter kind=timeout --status any`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.useIndex() {
				return indexList(cmd.Context(), a, sel, filter, status, limit, asJSON)
			}
			if filter != "" || cmd.Flags().Changed("status") || cmd.Flags().Changed("limit") {
				return errors.New("--filter, --status and --limit need the failure index: set --database-url or DATABASE_URL")
			}
			cl, topic, err := a.openDLQ(sel)
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx := cmd.Context()
			groups, err := cl.List(ctx, topic)
			if err != nil {
				return err
			}
			m, err := a.masker()
			if err != nil {
				return err
			}
			if err := a.maskGroups(ctx, m, cl, topic, groups); err != nil {
				return err
			}
			depth, err := cl.Depth(ctx, topic)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(a.out, struct {
					View       string      `json:"view"`
					Topic      string      `json:"topic"`
					AdminGroup string      `json:"admin_group"`
					Depth      int64       `json:"depth"`
					Groups     []dlq.Group `json:"groups"`
				}{"topic", topic, dlq.AdminGroup(topic), depth, groups})
			}
			a.topicView(topic)
			var stubs int64
			if len(groups) > 0 {
				tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "FINGERPRINT\tKIND\tTYPE\tCOUNT\tSTUBS\tFIRST SEEN\tLAST SEEN\tSAMPLE AT\tSAMPLE")
				for _, g := range groups {
					stubs += g.Stubs
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", g.Fingerprint, orDash(text(string(g.Kind))), orDash(text(g.ErrorType)),
						g.Count, g.Stubs, fmtTime(g.FirstSeen), fmtTime(g.LastSeen), at(g.SamplePartition, g.SampleOffset), truncate(g.SampleError, 80))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			fmt.Fprintf(a.out, "depth: %d pending in %s (admin group %s)\n", depth, topic, dlq.AdminGroup(topic))
			if stubs > 0 {
				fmt.Fprintf(a.out, "%s pending: value omitted, never replayed\n", plural(stubs, "stub"))
			}
			if len(groups) > 0 {
				fmt.Fprintf(a.out, "SAMPLE AT is PARTITION/OFFSET: idem dlq show -t %s --partition P --offset N\n", topic)
			}
			return nil
		},
	}
	readFlags(c, &sel, &asJSON)
	c.Flags().StringVar(&filter, "filter", "", "with a database: kind=…,error~=…,key=…,fingerprint=… (all must match)")
	c.Flags().StringVar(&status, "status", "unresolved", "with a database: statuses to list, comma-separated, or any")
	c.Flags().IntVar(&limit, "limit", 50, "with a database: records to list (at most 1000)")
	return c
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

func newShowCmd(a *app) *cobra.Command {
	var sel dlqTopic
	var key string
	var partition int32
	var offset, id int64
	var asJSON bool
	c := &cobra.Command{
		Use:   "show",
		Short: "Show one dead-letter record with its decoded failure and payload",
		Long: `Show one dead-letter record with its decoded failure and payload, by
--partition/--offset, by --key (the Kafka key, the derived idempotency key or
the idempotency-key header; the most recent match), or, with a database, by
--id. A stub (value omitted) is marked. With a database, the record comes
from the failure index, with its status, lineage and edits, even after it
expired from the topic.`,
		Example: `  idem dlq show -t payments.billing.dlq --partition 0 --offset 42
  idem dlq show --source payments --group billing --key order-42 --json
  idem dlq show --database-url postgres://idem@db/idem --id 42`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			byOffset := cmd.Flags().Changed("offset")
			if id != 0 && (byOffset || key != "") {
				return errors.New("give one of --id, --offset (with --partition) or --key")
			}
			if a.useIndex() && (id != 0 || (byOffset && offset >= 0) || (!byOffset && key != "")) {
				return indexShow(cmd.Context(), a, sel, id, byOffset, partition, offset, key, asJSON)
			}
			if id != 0 {
				return errors.New("--id needs the failure index: set --database-url or DATABASE_URL")
			}
			switch {
			case byOffset && key != "":
				return errors.New("give either --offset (with --partition) or --key, not both")
			case !byOffset && key == "":
				return errors.New("give --offset N [--partition P] or --key K")
			case byOffset && offset < 0:
				return fmt.Errorf("--offset %d: must be >= 0", offset)
			}
			cl, topic, err := a.openDLQ(sel)
			if err != nil {
				return err
			}
			defer cl.Close()
			r, err := cl.Show(cmd.Context(), topic, dlq.Position{Partition: partition, Offset: offset, Key: key})
			if err != nil {
				return err
			}
			m, err := a.masker()
			if err != nil {
				return err
			}
			dec, note := a.decodeValue(cmd.Context(), r.Value)
			if dec != nil {
				cp := *r
				cp.Value = dec
				r = &cp
			}
			r = maskDLQRecord(m, r)
			if asJSON {
				return showJSON(a.out, r, note)
			}
			a.topicView(topic)
			showText(a.out, r, note)
			return nil
		},
	}
	dlqTopicFlags(c, &sel)
	c.Flags().Int32VarP(&partition, "partition", "p", 0, "partition of --offset")
	c.Flags().Int64VarP(&offset, "offset", "o", -1, "offset of the record")
	c.Flags().StringVarP(&key, "key", "k", "", "record key, derived idempotency key or idempotency-key header (the most recent match is shown)")
	c.Flags().Int64Var(&id, "id", 0, "with a database: the record's id in the failure index (see dlq list)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// payload renders a value: indented JSON when it is JSON, text when it is
// UTF-8 (lines that are not printable Go-quoted, see block), else a hex dump
// (whose text column shows only printable ASCII).
func payload(w io.Writer, v []byte) {
	switch {
	case v == nil:
		block(w, "(null: tombstone)")
	case len(v) == 0:
		block(w, "(empty)")
	case !utf8.Valid(v):
		block(w, hex.Dump(v))
	default:
		var buf bytes.Buffer
		if json.Valid(v) && json.Indent(&buf, v, "", "  ") == nil {
			block(w, buf.String())
		} else {
			block(w, string(v))
		}
	}
}

// showText prints r; note, when not nil, says which schema its value was
// decoded with (r.Value is then the decoded JSON).
func showText(w io.Writer, r *dlq.Record, note *schemaNote) {
	f := r.Failure
	fmt.Fprintf(w, "record:    %s partition %d offset %d (timestamp %s)\n", r.Topic, r.Partition, r.Offset, fmtTime(r.Timestamp))
	if r.Key == nil {
		fmt.Fprintln(w, "key:       (null)")
	} else {
		fmt.Fprintf(w, "key:       %q\n", r.Key)
	}
	fmt.Fprintf(w, "fingerprint: %s\n", r.Fingerprint())
	fmt.Fprintln(w, "failure:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"kind", text(string(f.Kind))}, {"error-type", text(f.ErrorType)}, {"error", text(f.Error)},
		{"attempt", fmt.Sprint(f.Attempt)}, {"tier", fmt.Sprint(f.Tier)},
		{"original", fmt.Sprintf("%s partition %d offset %d", orDash(text(f.OriginalTopic)), f.OriginalPartition, f.OriginalOffset)},
		{"original-timestamp", fmtTime(f.OriginalTimestamp)}, {"consumer-group", text(f.Group)},
		{"first-failure-at", fmtTime(f.FirstFailureAt)}, {"last-failure-at", fmtTime(f.LastFailureAt)},
	}
	if !f.DueAt.IsZero() {
		rows = append(rows, [2]string{"due-at", fmtTime(f.DueAt)})
	}
	if t, p, ok := r.ReplayedFrom(); ok {
		// The dead letter this record was replayed from: its earlier failure.
		rows = append(rows, [2]string{"replay-of", fmt.Sprintf("%s partition %d offset %d", text(t), p.Partition, p.Offset)})
	}
	for _, row := range rows {
		fmt.Fprintf(tw, "  %s\t%s\n", row[0], orDash(row[1]))
	}
	_ = tw.Flush()
	if r.DecodeErr != nil {
		fmt.Fprintf(w, "  warning: %s\n", text(oneLine(r.DecodeErr.Error())))
	}
	if !r.HasFailure {
		fmt.Fprintln(w, "  (no idem-* headers: not written by idem)")
	}
	if r.IsStub() {
		fmt.Fprintf(w, "stub: value omitted (%d bytes); replay skips it\n", f.OmittedBytes)
	}
	fmt.Fprintln(w, "headers:")
	for _, h := range r.OriginalHeaders() {
		fmt.Fprintf(w, "  %s: %q\n", text(string(h.Key)), h.Value)
	}
	if len(f.Stack) > 0 {
		fmt.Fprintln(w, "stack:")
		block(w, string(f.Stack))
	}
	fmt.Fprintln(w, note.heading())
	payload(w, r.Value)
}

// jsonBytes renders record bytes for JSON: a string when they are valid
// UTF-8, else {"hex": "…"}, so nothing is silently replaced by U+FFFD; nil
// stays null.
func jsonBytes(b []byte) any {
	switch {
	case b == nil:
		return nil
	case utf8.Valid(b):
		return string(b)
	default:
		return map[string]string{"hex": hex.EncodeToString(b)}
	}
}

// showJSON writes r as JSON; with note, "value" is the decoded JSON and
// "value_schema" the schema it was decoded with (or why it was not).
func showJSON(w io.Writer, r *dlq.Record, note *schemaNote) error {
	// Headers in order, duplicates kept: [{"key": …, "value": …}, …].
	headers := []map[string]any{}
	for _, h := range r.OriginalHeaders() {
		headers = append(headers, map[string]any{"key": jsonBytes(h.Key), "value": jsonBytes(h.Value)})
	}
	value := jsonBytes(r.Value)
	if utf8.Valid(r.Value) && json.Valid(r.Value) {
		value = json.RawMessage(r.Value)
	}
	// The failure as the wire contract spells it: idem-* header names, taken
	// from the record itself so nothing is re-encoded.
	failure := map[string]any{}
	for _, h := range r.Headers {
		if wire.IsIdemHeader(h.Key) {
			failure[string(h.Key)] = jsonBytes(h.Value)
		}
	}
	out := map[string]any{
		"topic": r.Topic, "partition": r.Partition, "offset": r.Offset, "timestamp": r.Timestamp,
		"key": jsonBytes(r.Key), "headers": headers, "fingerprint": r.Fingerprint(), "failure": failure, "value": value,
		"stub": r.IsStub(), "idempotency_key": r.IdempotencyKey(), "view": "topic",
	}
	if r.DecodeErr != nil {
		out["decode_error"] = r.DecodeErr.Error()
	}
	if note != nil {
		out["value_schema"] = note.json()
	}
	return writeJSON(w, out)
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

func newReplayCmd(a *app) *cobra.Command {
	var sel dlqTopic
	var to, filter string
	var rate float64
	var tier int
	var dryRun, drop bool
	var ids []int64
	var reason, status string
	var allowed []string
	c := &cobra.Command{
		Use:   "replay",
		Short: "Republish pending dead-letter records to their source topic or to a topic you name",
		Long: `Republish pending dead-letter records, keeping key, value and original headers
(including idempotency-key, so already-handled records are dropped as duplicates).

--to says where records go:
  source (default)  each record's idem-original-topic, as a fresh record
                    (idem-* headers removed), to its original partition
  TOPIC             a retry tier of each record's origin for its group,
                    e.g. payments.billing.retry.1: the record keeps its
                    idem-* history, due now, with idem-tier from --tier
                    (default: n of <topic>.<group>.retry.<n>); any other
                    topic must be listed with --replay-topic
idem never guesses tier names and never creates a topic. A --to topic that
does not exist is an error before anything is read; with source, replay stops
at the first record whose original topic does not exist, and that record
stays pending (list still shows it).

Without a database, "pending" is one committed offset per partition (the
admin group): replay handles the records pending when it starts and commits
the admin group past all of them. So a replay that would leave records
unsent, records the --filter does not match or stubs, is REFUSED unless
--drop-unmatched-from-pending says to drop them from pending (they stay in
the topic; show still finds them). A replay that matches nothing exits 1.
--dry-run says what a real run would send and drop. A stub (a record
dead-lettered without its value) is never replayed.

With --database-url (or DATABASE_URL) replay works on the failure index
instead (idem console's index): each record has its own status, a replay of
a subset leaves the others unresolved, and every replay is audited.

--filter terms (comma-separated, all must match):
  kind=retriable|permanent|panic|missing-key|invalid-key|decode|timeout
  error~=REGEXP      (matched anywhere in idem-error)
  key=K              (record key, derived idempotency key or idempotency-key header)
  fingerprint=PREFIX (as dlq list shows it)`,
		Example: `  idem dlq replay -t payments.billing.dlq --dry-run
  idem dlq replay --source payments --group billing --filter kind=timeout --rate 50
  idem dlq replay -t payments.billing.dlq --to payments.billing.retry.1
  idem dlq replay --database-url postgres://idem@db/idem --id 42 --id 43 --reason "ledger fixed"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.useIndex() {
				if drop {
					return errors.New("--drop-unmatched-from-pending: with a database, records not replayed stay unresolved; nothing to drop")
				}
				if strings.TrimSpace(to) == "" {
					return errors.New("--to is empty: give source or a topic name")
				}
				if rate < 0 || rate != math.Trunc(rate) || rate > math.MaxInt32 {
					// Truncating 0.5 to 0 would mean no cap at all.
					return fmt.Errorf("--rate %v: with a database, give whole records a second (1 or more; 0 for no cap)", rate)
				}
				s, err := selection(sel, filter, status, ids)
				if err != nil {
					return err
				}
				return indexReplay(cmd.Context(), a, s, to, tier, rate, reason, dryRun, allowed)
			}
			if len(ids) > 0 || reason != "" || cmd.Flags().Changed("status") {
				return errors.New("--id, --reason and --status need the failure index: set --database-url or DATABASE_URL (and no --from-topic)")
			}
			f, err := dlq.ParseFilter(filter)
			if err != nil {
				return err
			}
			if strings.TrimSpace(to) == "" {
				return errors.New("--to is empty: give source or a topic name")
			}
			if rate < 0 {
				return fmt.Errorf("--rate %v: must be >= 0", rate)
			}
			if tier < 0 {
				return fmt.Errorf("--tier %d: must be >= 1 (0: from the topic name)", tier)
			}
			if tier > 0 && to == replayrec.ToSource {
				return errors.New("--tier applies to a named --to topic, not to source")
			}
			cl, topic, err := a.openDLQ(sel)
			if err != nil {
				return err
			}
			defer cl.Close()
			dest := to
			opts := dlq.ReplayOptions{Topic: topic, To: dest, Tier: tier, Filter: f, Rate: rate, DryRun: dryRun, DropUnmatched: drop, AllowedTopics: allowed}
			a.topicView(topic)
			tty := isTerminal(a.out)
			if tty {
				opts.Progress = func(done, total int64) { progressBar(a.out, done, total) }
			}
			res, err := cl.Replay(cmd.Context(), opts)
			if tty && res.Pending > 0 {
				fmt.Fprintln(a.out)
			}
			return replayReport(a, topic, dest, opts, res, err)
		},
	}
	dlqTopicFlags(c, &sel)
	c.Flags().StringVar(&to, "to", replayrec.ToSource, "destination: source (each record's idem-original-topic) or an existing topic name, e.g. a retry tier")
	c.Flags().IntVar(&tier, "tier", 0, "idem-tier written with a named --to topic (default: n of <topic>.<group>.retry.<n>, else 1)")
	c.Flags().StringVar(&filter, "filter", "", "kind=…,error~=…,key=…,fingerprint=… (all must match)")
	c.Flags().Float64Var(&rate, "rate", 0, "max records per second (0 = unlimited; with a database, a whole number)")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be replayed and dropped; send and commit nothing")
	c.Flags().Int64SliceVar(&ids, "id", nil, "with a database: record id in the failure index (repeatable)")
	c.Flags().StringVar(&reason, "reason", "", "with a database: why, kept in the record and the audit log")
	c.Flags().StringVar(&status, "status", "unresolved", "with a database and --filter: statuses to select (only unresolved records are sent)")
	c.Flags().BoolVar(&drop, "drop-unmatched-from-pending", false, "without a database: allow a replay that leaves records unsent (not matched by --filter, or stubs); they stop being pending")
	c.Flags().StringSliceVar(&allowed, "replay-topic", nil, "topic --to may name besides each record's origin and its group's retry tiers (repeatable)")
	return c
}

// stubList renders stub positions for a message, the first 10 of them.
func stubList(ps []dlq.Position) string {
	var b strings.Builder
	for i, p := range ps {
		if i == 10 {
			fmt.Fprintf(&b, ", … (%d more)", len(ps)-10)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "partition %d offset %d", p.Partition, p.Offset)
	}
	return b.String()
}

// replayReport prints what an offset-model replay did, or turns its refusal
// into an error that says what to do.
func replayReport(a *app, topic string, dest string, opts dlq.ReplayOptions, res dlq.ReplayResult, err error) error {
	stubs := int64(len(res.Stubs))
	switch {
	case err == nil && res.Pending == 0:
		return fmt.Errorf("nothing pending in %s: nothing replayed", topic)
	case errors.Is(err, dlq.ErrNothingMatched):
		msg := fmt.Sprintf("no pending record of %s matched: %d pending, %d not matched by the filter", topic, res.Pending, res.Skipped)
		if stubs > 0 {
			msg += fmt.Sprintf(", %s (never replayed: %s)", plural(stubs, "stub"), stubList(res.Stubs))
		}
		return errors.New(msg + "; nothing sent or committed")
	case errors.Is(err, dlq.ErrUnmatched):
		msg := fmt.Sprintf("refused: %d of %d pending records of %s match", res.Replayed, res.Pending, topic)
		if res.Skipped > 0 {
			msg += fmt.Sprintf("; %d not matched by the filter", res.Skipped)
		}
		if stubs > 0 {
			msg += fmt.Sprintf("; %s never replayed (value omitted: %s)", plural(stubs, "stub"), stubList(res.Stubs))
		}
		return errors.New(msg + ". Without a database, pending is one offset per partition: this replay would make them no longer pending. " +
			"Give --drop-unmatched-from-pending to do so, or --database-url to replay from the failure index, which keeps them unresolved. Nothing sent or committed")
	case err != nil:
		if errors.Is(err, dlq.ErrUnknownTopic) && (dest == "retry" || dest == "origin") {
			return fmt.Errorf("%w (--to takes source or a topic name: name the retry tier, e.g. <topic>.<group>.retry.1)", err)
		}
		return fmt.Errorf("%w (replayed %d before stopping)", err, res.Replayed)
	}
	if opts.DryRun {
		fmt.Fprintf(a.out, "dry run: would replay %d of %d pending records to %s (%d skipped by the filter); nothing sent or committed\n",
			res.Replayed, res.Pending, dest, res.Skipped)
		if stubs > 0 {
			fmt.Fprintf(a.out, "%s would not be replayed (value omitted): %s\n", plural(stubs, "stub"), stubList(res.Stubs))
		}
		if unsent := res.Skipped + stubs; unsent > 0 {
			fmt.Fprintf(a.out, "warning: %d records would not be sent and would NO LONGER BE PENDING after this replay; a real run refuses unless --drop-unmatched-from-pending\n", unsent)
		}
		return nil
	}
	fmt.Fprintf(a.out, "replayed %d of %d pending records to %s\n", res.Replayed, res.Pending, dest)
	if res.Skipped > 0 {
		fmt.Fprintf(a.out, "%d records skipped by the filter are no longer pending (--drop-unmatched-from-pending; still in %s)\n", res.Skipped, topic)
	}
	if stubs > 0 {
		fmt.Fprintf(a.out, "%s not replayed (value omitted) and no longer pending: %s\n", plural(stubs, "stub"), stubList(res.Stubs))
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func progressBar(w io.Writer, done, total int64) {
	const width = 30
	n := width
	if total > 0 {
		n = int(done * width / total)
	}
	fmt.Fprintf(w, "\r[%s%s] %d/%d", strings.Repeat("#", n), strings.Repeat(".", width-n), done, total)
}

func newPurgeCmd(a *app) *cobra.Command {
	var sel dlqTopic
	var yes bool
	c := &cobra.Command{
		Use:   "purge",
		Short: "Mark every pending dead-letter record as dealt with (depth 0)",
		Long: `Commit the admin group at the end of the topic so nothing is pending. Records stay
in the topic until retention deletes them. Asks for confirmation unless --yes.`,
		Example: `  idem dlq purge -t payments.billing.dlq
  idem dlq purge --source payments --group billing --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, topic, err := a.openDLQ(sel)
			if err != nil {
				return err
			}
			defer cl.Close()
			a.topicView(topic)
			if !yes {
				depth, err := cl.Depth(cmd.Context(), topic)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.out, "purge %d pending records of %s? [y/N] ", depth, topic)
				line, _ := bufio.NewReader(a.in).ReadString('\n')
				if ans := strings.ToLower(strings.TrimSpace(line)); ans != "y" && ans != "yes" {
					fmt.Fprintln(a.out)
					return errors.New("purge not confirmed; nothing changed")
				}
			}
			n, err := cl.Purge(cmd.Context(), topic)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "purged %d pending records of %s\n", n, topic)
			return nil
		},
	}
	dlqTopicFlags(c, &sel)
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

func newDepthCmd(a *app) *cobra.Command {
	var sel dlqTopic
	var asJSON bool
	c := &cobra.Command{
		Use:   "depth",
		Short: "Count pending dead-letter records, per partition and in total",
		Long: `Count the pending records of a dead-letter topic: per partition, the dead
letters from the admin group's committed offset (or the earliest retained
offset when that is later) to the end, and their total, the value
idem_dlq_depth reports. A topic written with transactions holds commit
markers and aborted records, which take offsets and are not counted. Always
the topic's view; where an indexer runs, it moves the admin group up to the
first record the failure index has not settled. Changes nothing.`,
		Example: `  idem dlq depth -t payments.billing.dlq
  idem dlq depth --source payments --group billing --json | jq .total`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, topic, err := a.openDLQ(sel)
			if err != nil {
				return err
			}
			defer cl.Close()
			parts, err := cl.DepthByPartition(cmd.Context(), topic)
			if err != nil {
				return err
			}
			var total int64
			for _, p := range parts {
				total += p.Pending
			}
			if asJSON {
				return writeJSON(a.out, struct {
					View       string               `json:"view"`
					Topic      string               `json:"topic"`
					AdminGroup string               `json:"admin_group"`
					Partitions []dlq.PartitionDepth `json:"partitions"`
					Total      int64                `json:"total"`
				}{"topic", topic, dlq.AdminGroup(topic), parts, total})
			}
			a.topicView(topic)
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintln(tw, "PARTITION\tSTART\tEND\tPENDING\t")
			for _, p := range parts {
				fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t\n", p.Partition, p.Start, p.End, p.Pending)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "total: %d pending in %s (admin group %s)\n", total, topic, dlq.AdminGroup(topic))
			return nil
		},
	}
	readFlags(c, &sel, &asJSON)
	return c
}

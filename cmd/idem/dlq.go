package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/retrytopic"
)

func newDLQCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "dlq",
		Short: "Inspect, replay and purge dead-letter topics",
		Long: `Inspect, replay and purge dead-letter topics.

Pending records are those past the committed offsets of the consumer group
"<dlq-topic>.admin". replay and purge move that group forward; list, show and
depth never change anything.`,
	}
	c.AddCommand(newListCmd(a), newShowCmd(a), newReplayCmd(a), newPurgeCmd(a))
	return c
}

func topicFlag(c *cobra.Command, topic *string) {
	c.Flags().StringVarP(topic, "topic", "t", "", "dead-letter topic (required)")
	_ = c.MarkFlagRequired("topic")
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func truncate(s string, n int) string {
	s = oneLine(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

func newListCmd(a *app) *cobra.Command {
	var topic string
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "Group pending dead-letter records by failure fingerprint",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := a.openDLQ()
			if err != nil {
				return err
			}
			defer cl.Close()
			ctx := cmd.Context()
			groups, err := cl.List(ctx, topic)
			if err != nil {
				return err
			}
			depth, err := cl.Depth(ctx, topic)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.out)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				return enc.Encode(struct {
					Topic      string      `json:"topic"`
					AdminGroup string      `json:"admin_group"`
					Depth      int64       `json:"depth"`
					Groups     []dlq.Group `json:"groups"`
				}{topic, dlq.AdminGroup(topic), depth, groups})
			}
			if len(groups) > 0 {
				tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "FINGERPRINT\tKIND\tTYPE\tCOUNT\tFIRST SEEN\tLAST SEEN\tSAMPLE")
				for _, g := range groups {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", g.Fingerprint, orDash(string(g.Kind)), orDash(g.ErrorType),
						g.Count, fmtTime(g.FirstSeen), fmtTime(g.LastSeen), truncate(g.SampleError, 80))
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			fmt.Fprintf(a.out, "depth: %d pending in %s (admin group %s)\n", depth, topic, dlq.AdminGroup(topic))
			return nil
		},
	}
	topicFlag(c, &topic)
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newShowCmd(a *app) *cobra.Command {
	var topic, key string
	var partition int32
	var offset int64
	var asJSON bool
	c := &cobra.Command{
		Use:   "show",
		Short: "Show one dead-letter record with its decoded failure and payload",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			byOffset := cmd.Flags().Changed("offset")
			switch {
			case byOffset && key != "":
				return errors.New("give either --offset (with --partition) or --key, not both")
			case !byOffset && key == "":
				return errors.New("give --offset N [--partition P] or --key K")
			case byOffset && offset < 0:
				return fmt.Errorf("--offset %d: must be >= 0", offset)
			}
			cl, err := a.openDLQ()
			if err != nil {
				return err
			}
			defer cl.Close()
			r, err := cl.Show(cmd.Context(), topic, dlq.Position{Partition: partition, Offset: offset, Key: key})
			if err != nil {
				return err
			}
			if asJSON {
				return showJSON(a.out, r)
			}
			showText(a.out, r)
			return nil
		},
	}
	topicFlag(c, &topic)
	c.Flags().Int32VarP(&partition, "partition", "p", 0, "partition of --offset")
	c.Flags().Int64VarP(&offset, "offset", "o", -1, "offset of the record")
	c.Flags().StringVarP(&key, "key", "k", "", "record key or idempotency-key header (the most recent match is shown)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// payload renders a value: indented JSON when it is JSON, text when it is
// UTF-8, else a hex dump.
func payload(v []byte) string {
	if v == nil {
		return "(null: tombstone)"
	}
	if len(v) == 0 {
		return "(empty)"
	}
	var buf bytes.Buffer
	if json.Valid(v) && json.Indent(&buf, v, "", "  ") == nil {
		return buf.String()
	}
	if utf8.Valid(v) {
		return string(v)
	}
	return hex.Dump(v)
}

func showText(w io.Writer, r *dlq.Record) {
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
		{"kind", string(f.Kind)}, {"error-type", f.ErrorType}, {"error", f.Error},
		{"attempt", fmt.Sprint(f.Attempt)}, {"tier", fmt.Sprint(f.Tier)},
		{"original", fmt.Sprintf("%s partition %d offset %d", orDash(f.OriginalTopic), f.OriginalPartition, f.OriginalOffset)},
		{"original-timestamp", fmtTime(f.OriginalTimestamp)}, {"consumer-group", f.Group},
		{"first-failure-at", fmtTime(f.FirstFailureAt)}, {"last-failure-at", fmtTime(f.LastFailureAt)},
	}
	if !f.DueAt.IsZero() {
		rows = append(rows, [2]string{"due-at", fmtTime(f.DueAt)})
	}
	for _, row := range rows {
		fmt.Fprintf(tw, "  %s\t%s\n", row[0], orDash(row[1]))
	}
	_ = tw.Flush()
	if r.DecodeErr != nil {
		fmt.Fprintf(w, "  warning: %s\n", oneLine(r.DecodeErr.Error()))
	}
	if !r.HasFailure {
		fmt.Fprintln(w, "  (no idem-* headers: not written by idem)")
	}
	fmt.Fprintln(w, "headers:")
	for _, h := range r.OriginalHeaders() {
		fmt.Fprintf(w, "  %s: %q\n", h.Key, h.Value)
	}
	if len(f.Stack) > 0 {
		fmt.Fprintln(w, "stack:")
		for _, l := range strings.Split(strings.TrimRight(string(f.Stack), "\n"), "\n") {
			fmt.Fprintln(w, "  "+l)
		}
	}
	fmt.Fprintln(w, "payload:")
	for _, l := range strings.Split(strings.TrimRight(payload(r.Value), "\n"), "\n") {
		fmt.Fprintln(w, "  "+l)
	}
}

func showJSON(w io.Writer, r *dlq.Record) error {
	headers := map[string]string{}
	for _, h := range r.OriginalHeaders() {
		headers[string(h.Key)] = string(h.Value)
	}
	var value any
	switch {
	case r.Value == nil:
	case json.Valid(r.Value):
		value = json.RawMessage(r.Value)
	case utf8.Valid(r.Value):
		value = string(r.Value)
	default:
		value = map[string]string{"hex": hex.EncodeToString(r.Value)}
	}
	var key *string
	if r.Key != nil {
		k := string(r.Key)
		key = &k
	}
	// The failure as the wire contract spells it: idem-* header names.
	failure := map[string]string{}
	for _, h := range retrytopic.Encode([]sarama.RecordHeader(nil), r.Failure) {
		failure[string(h.Key)] = string(h.Value)
	}
	out := map[string]any{
		"topic": r.Topic, "partition": r.Partition, "offset": r.Offset, "timestamp": r.Timestamp,
		"key": key, "headers": headers, "fingerprint": r.Fingerprint(), "failure": failure, "value": value,
	}
	if r.DecodeErr != nil {
		out["decode_error"] = r.DecodeErr.Error()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

func newReplayCmd(a *app) *cobra.Command {
	var topic, to, filter string
	var rate float64
	var dryRun bool
	c := &cobra.Command{
		Use:   "replay",
		Short: "Republish pending dead-letter records to their original topic or first retry tier",
		Long: `Republish pending dead-letter records, keeping key, value and original headers
(including idempotency-key, so already-handled records are dropped as duplicates).

Replay handles the records pending when it starts and then commits the admin
group past all of them: records the --filter skips are NO LONGER PENDING
afterwards (they stay in the topic; show still finds them). A second replay
does not repeat the first.

--filter terms (comma-separated, all must match):
  kind=retriable|permanent|panic|missing-key|invalid-key|decode|timeout
  error~=REGEXP      (matched anywhere in idem-error)
  key=K              (record key or idempotency-key header)
  fingerprint=PREFIX (as dlq list shows it)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := dlq.ParseFilter(filter)
			if err != nil {
				return err
			}
			dest := dlq.Destination(to)
			if dest != dlq.ToOrigin && dest != dlq.ToRetry {
				return fmt.Errorf("--to %q: want origin or retry", to)
			}
			if rate < 0 {
				return fmt.Errorf("--rate %v: must be >= 0", rate)
			}
			cl, err := a.openDLQ()
			if err != nil {
				return err
			}
			defer cl.Close()
			opts := dlq.ReplayOptions{Topic: topic, To: dest, Filter: f, Rate: rate, DryRun: dryRun}
			tty := isTerminal(a.out)
			if tty {
				opts.Progress = func(done, total int64) { progressBar(a.out, done, total) }
			}
			res, err := cl.Replay(cmd.Context(), opts)
			if tty && res.Pending > 0 {
				fmt.Fprintln(a.out)
			}
			if err != nil {
				return fmt.Errorf("%w (replayed %d, skipped %d before stopping)", err, res.Replayed, res.Skipped)
			}
			if dryRun {
				fmt.Fprintf(a.out, "dry run: would replay %d of %d pending records to %s (%d skipped by the filter); nothing sent or committed\n",
					res.Replayed, res.Pending, dest, res.Skipped)
				return nil
			}
			fmt.Fprintf(a.out, "replayed %d of %d pending records to %s\n", res.Replayed, res.Pending, dest)
			if res.Skipped > 0 {
				fmt.Fprintf(a.out, "%d records skipped by the filter are no longer pending (still in %s)\n", res.Skipped, topic)
			}
			return nil
		},
	}
	topicFlag(c, &topic)
	c.Flags().StringVar(&to, "to", string(dlq.ToOrigin), "destination: origin (idem-original-topic) or retry (first retry tier)")
	c.Flags().StringVar(&filter, "filter", "", "kind=…,error~=…,key=…,fingerprint=… (all must match)")
	c.Flags().Float64Var(&rate, "rate", 0, "max records per second (0 = unlimited)")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be replayed; send and commit nothing")
	return c
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
	var topic string
	var yes bool
	c := &cobra.Command{
		Use:   "purge",
		Short: "Mark every pending dead-letter record as dealt with (depth 0)",
		Long: `Commit the admin group at the end of the topic so nothing is pending. Records stay
in the topic until retention deletes them. Asks for confirmation unless --yes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, err := a.openDLQ()
			if err != nil {
				return err
			}
			defer cl.Close()
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
	topicFlag(c, &topic)
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

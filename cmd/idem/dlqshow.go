package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/wire"
)

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

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/user"
	"strings"
	"text/tabwriter"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/failidx"
)

// dlqDBFlags adds --database-url to the dlq command: with it (or
// DATABASE_URL) list, show, replay, resolve and archive work on the failure
// index instead of the admin group's offsets.
func (a *app) dlqDBFlags(c *cobra.Command) {
	f := c.PersistentFlags()
	f.StringVar(&a.dlqDB, "database-url", "", "PostgreSQL URL of the failure index: list, show, replay, resolve and archive then work per record")
	envFlag(f, "database-url", "DATABASE_URL")
	f.StringVar(&a.actor, "actor", "", "who acts, recorded in the index's audit log beside the OS user the CLI runs as")
	envFlag(f, "actor", "IDEM_ACTOR")
	f.StringSliceVar(&a.mask, "mask", nil, "JSON path to mask in list and show, e.g. card.number (repeatable); masked values and card numbers are also hidden in errors, stacks, headers and keys")
	envFlag(f, "mask", "IDEM_MASK")
	encryptionFlag(f, &a.keyFile)
	f.StringVar(&a.registryURL, "registry-url", "", "the schema registry's Confluent-compatible API: list and show decode values in its wire format (Avro, Protobuf, JSON Schema) to JSON, and --mask applies to the decoded fields; auth from IDEM_REGISTRY_USER and IDEM_REGISTRY_PASSWORD, or IDEM_REGISTRY_TOKEN")
	envFlag(f, "registry-url", "SCHEMA_REGISTRY_URL")
	f.BoolVar(&a.fromTopic, "from-topic", false, "read the dead-letter topic itself (its admin group's offsets), even with --database-url or DATABASE_URL")
}

// useIndex reports whether the dlq commands work on the failure index: a
// database is given and --from-topic is not.
func (a *app) useIndex() bool { return a.dlqDB != "" && !a.fromTopic }

// actorName is who the audit log records: the OS user the CLI runs as
// (whose name the CLI cannot choose), with --actor beside it when given:
// "alice (os user ops)".
func (a *app) actorName() string {
	osUser := "unknown"
	if u, err := user.Current(); err == nil && u.Username != "" {
		osUser = u.Username
	} else if v := a.env("USER"); v != "" {
		osUser = v
	}
	if a.actor == "" || a.actor == osUser {
		return osUser
	}
	return fmt.Sprintf("%s (os user %s)", a.actor, osUser)
}

// indexView and topicView are the first line of each dlq command's answer:
// which view of "pending" it shows.
func (a *app) indexView() {
	fmt.Fprintln(a.out, "view: failure index (each dead letter's status in PostgreSQL; --from-topic for the topic's)")
}

func (a *app) topicView(topic string) {
	fmt.Fprintf(a.out, "view: topic %s (pending: past the admin group %s)\n", topic, dlq.AdminGroup(topic))
}

// errIndexBlind is the error of a command asked about topic from an index
// that holds none of its records while the topic has pending ones: no
// indexer has read it, and the index's answer ("nothing") would be wrong.
type errIndexBlind struct {
	topic   string
	pending int64
}

func (e *errIndexBlind) Error() string {
	return fmt.Sprintf("the failure index holds 0 records of %s, but the topic has %d pending dead letters: no indexer has read them. "+
		"Index them with idem console (its indexer reads every topic ending in .dlq, or --topics %s) or an index.Indexer, "+
		"or read the topic itself with --from-topic", e.topic, e.pending, e.topic)
}

// checkIndexed returns an *errIndexBlind when the index s holds no record
// of topic while topic has pending dead letters. It says nothing when the
// topic cannot be read (the index's answer stands).
func (a *app) checkIndexed(ctx context.Context, s *failidx.Store, topic string) error {
	if topic == "" {
		return nil
	}
	held, err := s.HoldsTopic(ctx, topic)
	if err != nil || held {
		return err
	}
	cl, _, err := a.openDLQ(dlqTopic{topic: topic})
	if err != nil {
		return nil
	}
	defer cl.Close()
	pending, err := cl.Depth(ctx, topic)
	if err != nil || pending == 0 {
		return nil
	}
	return &errIndexBlind{topic: topic, pending: pending}
}

// openIndex opens the failure index. It creates nothing: a database without
// the index's tables is an error that says how to get the offset model.
func (a *app) openIndex(ctx context.Context) (*failidx.Store, func(), error) {
	pool, err := openPool(ctx, a.dlqDB)
	if err != nil {
		return nil, nil, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idem_dlq_records') IS NOT NULL`).Scan(&exists); err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("database: %w", err)
	}
	if !exists {
		pool.Close()
		return nil, nil, errors.New("this database has no failure index (idem_dlq_records): run `idem migrate` and an indexer (idem console), " +
			`or give --database-url "" (or unset DATABASE_URL) to work on the DLQ topic's offsets`)
	}
	sl, err := a.indexSealer(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return failidx.NewStore(pool).Sealed(sl), pool.Close, nil
}

// indexFilter builds the index filter of a command: the topic flags (all
// optional here), --filter terms and --status.
func indexFilter(t dlqTopic, filter, status string) (failidx.Filter, error) {
	var f failidx.Filter
	if t.topic != "" || t.source != "" || t.group != "" {
		topic, err := t.name()
		if err != nil {
			return f, err
		}
		f.Topic = topic
	}
	df, err := dlq.ParseFilter(filter)
	if err != nil {
		return f, err
	}
	f.Kind, f.Key, f.Fingerprint = string(df.Kind), df.Key, df.Fingerprint
	if df.Error != nil {
		// The index matches error text by substring, not by regexp.
		if strings.ContainsAny(df.Error.String(), `\.+*?()|[]{}^$`) {
			return f, fmt.Errorf("dlq: bad filter: error~=%q: with a database, error~= matches a plain substring (case-insensitive), not a regexp", df.Error.String())
		}
		f.ErrorContains = df.Error.String()
	}
	for _, s := range strings.Split(status, ",") {
		if s = strings.TrimSpace(s); s == "" || s == "any" {
			continue
		}
		if !failidx.Status(s).Valid() {
			return f, fmt.Errorf("--status %q: want unresolved, replayed, resolved, archived or any", s)
		}
		f.Status = append(f.Status, failidx.Status(s))
	}
	return f, nil
}

// stubMark marks stubs in a table column.
func stubMark(r failidx.Record) string {
	if r.Stub {
		return "stub"
	}
	if r.ValueTruncated {
		return "truncated"
	}
	return "-"
}

func indexList(ctx context.Context, a *app, t dlqTopic, filter, status string, limit int, asJSON bool) error {
	f, err := indexFilter(t, filter, status)
	if err != nil {
		return err
	}
	s, closeDB, err := a.openIndex(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	if err := a.checkIndexed(ctx, s, f.Topic); err != nil {
		return err
	}
	groups, err := s.Groups(ctx, f)
	if err != nil {
		return err
	}
	page, err := s.List(ctx, f, "", limit)
	if err != nil {
		return err
	}
	m, err := a.masker()
	if err != nil {
		return err
	}
	if err := a.maskIndexList(ctx, m, s, groups, page.Records); err != nil {
		return err
	}
	if asJSON {
		type rec struct {
			ID             int64  `json:"id"`
			Topic          string `json:"topic"`
			Partition      int32  `json:"partition"`
			Offset         int64  `json:"offset"`
			Status         string `json:"status"`
			Kind           string `json:"kind"`
			IdempotencyKey string `json:"idempotency_key"`
			Stub           bool   `json:"stub"`
			Error          string `json:"error"`
			LastFailureAt  string `json:"last_failure_at"`
		}
		out := struct {
			Source  string                 `json:"source"`
			View    string                 `json:"view"`
			Groups  []failidx.FailureGroup `json:"groups"`
			Records []rec                  `json:"records"`
			More    bool                   `json:"more"`
		}{Source: "index", View: "index", Groups: groups, Records: []rec{}, More: page.Next != ""}
		for _, r := range page.Records {
			out.Records = append(out.Records, rec{r.ID, r.Topic, r.Partition, r.Offset, string(r.Status), r.Kind, r.IdempotencyKey, r.Stub, r.Error, fmtTime(r.LastFailureAt)})
		}
		return writeJSON(a.out, out)
	}
	a.indexView()
	if len(groups) > 0 {
		tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FINGERPRINT\tKIND\tGROUP\tTOPIC\tCOUNT\tUNRESOLVED\tFIRST SEEN\tLAST SEEN\tSAMPLE")
		for _, g := range groups {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", g.Fingerprint, orDash(text(g.Kind)), orDash(text(g.Group)), text(g.Topic),
				g.Count, g.Unresolved, fmtTime(g.FirstSeen), fmtTime(g.LastSeen), truncate(g.SampleError, 60))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(a.out)
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTOPIC\tPARTITION/OFFSET\tSTATUS\tKIND\tIDEMPOTENCY KEY\tVALUE\tLAST FAILURE\tERROR")
	for _, r := range page.Records {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, text(r.Topic), at(r.Partition, r.Offset), r.Status, orDash(text(r.Kind)),
			orDash(truncate(r.IdempotencyKey, 32)), stubMark(r), fmtTime(r.LastFailureAt), truncate(r.Error, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if page.Next != "" {
		more = fmt.Sprintf(" (first %d; --limit for more)", len(page.Records))
	}
	fmt.Fprintf(a.out, "%d records in the failure index%s; show one with: idem dlq show --id ID\n", len(page.Records), more)
	return nil
}

// asDLQRecord renders an index record as the dlq package's record, for the
// shared show output.
func asDLQRecord(r failidx.Record) *dlq.Record {
	m := &sarama.ConsumerMessage{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value, Timestamp: r.LastFailureAt}
	for _, h := range r.Headers {
		m.Headers = append(m.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
	}
	return dlq.FromMessage(m)
}

func indexShow(ctx context.Context, a *app, t dlqTopic, id int64, byOffset bool, partition int32, offset int64, key string, asJSON bool) error {
	s, closeDB, err := a.openIndex(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	if id == 0 {
		f := failidx.Filter{Key: key}
		if byOffset {
			topic, err := t.name()
			if err != nil {
				return err
			}
			f = failidx.Filter{Topic: topic, HasOffset: true, Partition: partition, Offset: offset}
		} else if t.topic != "" || t.source != "" {
			if f.Topic, err = t.name(); err != nil {
				return err
			}
		}
		page, err := s.List(ctx, f, "", 1)
		if err != nil {
			return err
		}
		if len(page.Records) == 0 {
			if err := a.checkIndexed(ctx, s, f.Topic); err != nil {
				return err
			}
			return fmt.Errorf("%w: no record in the failure index matches", failidx.ErrNotFound)
		}
		id = page.Records[0].ID
	}
	r, err := s.Get(ctx, id)
	if err != nil {
		return err
	}
	m, err := a.masker()
	if err != nil {
		return err
	}
	var note *schemaNote
	if r.PayloadErr == nil && !r.ValueTruncated {
		var dec []byte
		if dec, note = a.decodeValue(ctx, r.Value); dec != nil {
			r.Value = dec
		}
	}
	for i, v := range r.Versions {
		r.Versions[i].Value = a.maskable(ctx, v.Value)
	}
	r = maskIndexRecord(m, r)
	if asJSON {
		return indexShowJSON(a.out, r, note)
	}
	a.indexView()
	fmt.Fprintf(a.out, "id:        %d\n", r.ID)
	if r.PayloadErr != nil {
		showUnreadable(a.out, r)
	} else {
		showText(a.out, asDLQRecord(r), note)
	}
	if r.ValueTruncated {
		fmt.Fprintf(a.out, "  (the index keeps the first %d of %d bytes)\n", len(r.Value), r.ValueSize)
	}
	fmt.Fprintf(a.out, "idempotency key: %s\n", orDash(text(r.IdempotencyKey)))
	fmt.Fprintf(a.out, "status:    %s at %s by %s", r.Status, fmtTime(r.StatusAt), orDash(text(r.StatusActor)))
	if r.StatusReason != "" {
		fmt.Fprintf(a.out, ": %s", text(r.StatusReason))
	}
	fmt.Fprintln(a.out)
	if r.PreviousID != 0 {
		fmt.Fprintf(a.out, "repeats:   record %d (an earlier failure of the same idempotency key)\n", r.PreviousID)
	}
	for _, v := range r.Versions {
		fmt.Fprintf(a.out, "version %d: edited by %s at %s (%s), published to %s partition %d offset %d:\n", v.N, text(v.Actor), fmtTime(v.At),
			text(v.Reason), v.PublishedTo, v.PublishedPartition, v.PublishedOffset)
		payload(a.out, v.Value)
	}
	return nil
}

func indexShowJSON(w io.Writer, r failidx.Record, note *schemaNote) error {
	var buf strings.Builder
	if err := showJSON(&buf, asDLQRecord(r), note); err != nil {
		return err
	}
	return writeJSON(w, map[string]any{
		"view": "index", "id": r.ID, "record": json.RawMessage(buf.String()), "idempotency_key": r.IdempotencyKey, "stub": r.Stub,
		"value_truncated": r.ValueTruncated, "value_size": r.ValueSize, "status": r.Status, "status_actor": r.StatusActor,
		"status_reason": r.StatusReason, "status_at": r.StatusAt, "previous_id": r.PreviousID, "versions": len(r.Versions),
		"key_id": r.KeyID, "payload_unavailable": failidx.Unavailable(r.PayloadErr),
	})
}

package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/internal/tables"
)

// newScheduleCmd builds `idem schedule list`.
func newScheduleCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "schedule <command>",
		Short: "Show messages deferred by handler.DeferUntil",
		Long: `Show the messages handlers deferred with handler.DeferUntil. They wait in
PostgreSQL (idem_deferred), their Kafka offsets already committed, until their
group's scheduler publishes them again when due.`,
		Example: `  idem schedule list --group payments`,
	}
	c.AddCommand(newScheduleListCmd(a))
	return c
}

func newScheduleListCmd(a *app) *cobra.Command {
	var url, group string
	var limit int
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List pending deferred messages in the order they come due",
		Long: `List the deferred messages waiting to be published again, soonest first:
group, destination topic and partition, Kafka key, idempotency key, where the
message was first consumed, the time its handler asked for, the next time the
scheduler will try (later after a failed publish), how many publishes failed
and the last error. Keys that are not printable text are shown as hex:….
Reads only.`,
		Example: `  idem schedule list --database-url postgres://idem@db/idem
  idem schedule list --group payments --limit 20 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 {
				return fmt.Errorf("--limit %d: must be at least 1", limit)
			}
			ctx := cmd.Context()
			pool, err := openPool(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			ps, err := tables.ListDeferred(ctx, pool, tables.DeferredFilter{Group: group, Limit: limit})
			if err != nil {
				return err
			}
			if asJSON {
				return scheduleJSON(a, ps)
			}
			scheduleText(a, ps, limit)
			return nil
		},
	}
	dbFlag(c, &url)
	c.Flags().StringVarP(&group, "group", "g", "", "consumer group (default: every group)")
	c.Flags().IntVar(&limit, "limit", 100, "show at most this many")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func scheduleText(a *app, ps []tables.Pending, limit int) {
	if len(ps) == 0 {
		fmt.Fprintln(a.out, "no deferred messages")
		return
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tGROUP\tTOPIC\tPARTITION\tKEY\tIDEMPOTENCY KEY\tORIGIN\tDEFERRED UNTIL\tDUE IN\tATTEMPTS\tLAST ERROR")
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p.ID, p.Group, p.Topic, p.Partition,
			truncate(showKey(p.Key), 40), orDash(truncate(p.IdempotencyKey, 40)), origin(p),
			p.DeferredUntil.UTC().Format(time.RFC3339), dueIn(p.DueAt), p.Attempts, orDash(truncate(p.LastError, 60)))
	}
	_ = tw.Flush()
	if len(ps) == limit {
		fmt.Fprintf(a.out, "(the first %d; --limit shows more)\n", limit)
	}
}

func origin(p tables.Pending) string {
	if p.Origin.Topic == "" {
		return "-"
	}
	return fmt.Sprintf("%s/%d@%d", p.Origin.Topic, p.Origin.Partition, p.Origin.Offset)
}

// dueIn is how long until t, or "due" when it has come.
func dueIn(t time.Time) string {
	if d := time.Until(t); d > 0 {
		return d.Round(time.Second).String()
	}
	return "due"
}

func scheduleJSON(a *app, ps []tables.Pending) error {
	type row struct {
		ID              int64     `json:"id"`
		Group           string    `json:"group"`
		Topic           string    `json:"topic"`
		Partition       int32     `json:"partition"`
		Key             *string   `json:"key"` // null when not UTF-8: see key_hex
		KeyHex          string    `json:"key_hex"`
		IdempotencyKey  string    `json:"idempotency_key"`
		OriginTopic     string    `json:"origin_topic"`
		OriginPartition int32     `json:"origin_partition"`
		OriginOffset    int64     `json:"origin_offset"`
		DeferredUntil   time.Time `json:"deferred_until"`
		DueAt           time.Time `json:"due_at"`
		CreatedAt       time.Time `json:"created_at"`
		Attempts        int       `json:"attempts"`
		LastError       string    `json:"last_error"`
	}
	out := struct {
		Deferred []row `json:"deferred"`
	}{Deferred: []row{}}
	for _, p := range ps {
		r := row{ID: p.ID, Group: p.Group, Topic: p.Topic, Partition: p.Partition, KeyHex: hex.EncodeToString(p.Key),
			IdempotencyKey: p.IdempotencyKey, OriginTopic: p.Origin.Topic, OriginPartition: p.Origin.Partition,
			OriginOffset: p.Origin.Offset, DeferredUntil: p.DeferredUntil, DueAt: p.DueAt, CreatedAt: p.CreatedAt,
			Attempts: p.Attempts, LastError: p.LastError}
		if utf8.Valid(p.Key) {
			s := string(p.Key)
			r.Key = &s
		}
		out.Deferred = append(out.Deferred, r)
	}
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

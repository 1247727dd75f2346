package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/outbox"
)

// newOutboxCmd builds `idem outbox relay|list|retry`.
func newOutboxCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "outbox",
		Short: "Run the transactional outbox relay; list and retry failed events",
		Long: `The transactional outbox (package outbox): handlers insert events with
outbox.Enqueue in their transaction; a relay publishes committed events to
Kafka and deletes them once acknowledged. relay runs one (any number may run:
one publishes, the others stand by); list shows rows; retry sends failed rows
again after their cause (unknown topic, size, ACLs) is fixed.`,
		Example: `  idem outbox relay --database-url postgres://idem@db/idem -b kafka-1:9092
  idem outbox list --failed`,
	}
	c.AddCommand(newOutboxRelayCmd(a), newOutboxListCmd(a), newOutboxRetryCmd(a))
	return c
}

func tableFlag(c *cobra.Command, table *string) {
	c.Flags().StringVar(table, "table", outboxstore.Table, "outbox table, optionally schema-qualified")
}

func newOutboxRelayCmd(a *app) *cobra.Command {
	var url, table, metricsAddr string
	r := outbox.Relay{}
	c := &cobra.Command{
		Use:   "relay",
		Short: "Publish the outbox to Kafka until interrupted",
		Long: `Publish committed outbox rows to Kafka (idempotent producer, acks=all) in id
order, one row per key in flight, deleting each once acknowledged. Runs until
Ctrl-C. Several relays may run for one table: a PostgreSQL advisory lock lets
one publish, the others take over within --leader-retry when it dies. Creates
the table when missing.`,
		Example: `  idem outbox relay --database-url postgres://… --metrics-addr :2113`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := openPool(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			scfg, brokers, err := a.saramaConfig()
			if err != nil {
				return err
			}
			scfg.ClientID = "idem-outbox-relay"
			scfg.Metadata.Retry.Max = 3
			reg := prometheus.NewRegistry()
			r.Pool, r.Brokers, r.Sarama, r.Table, r.Registerer = pool, brokers, scfg, table, reg
			r.Logger = slog.New(slog.NewTextHandler(a.errOut, nil))
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			var merr error
			var wg sync.WaitGroup
			if metricsAddr != "" { // /metrics, /healthz, /readyz
				wg.Go(func() {
					if merr = metrics.Serve(rctx, metricsAddr, reg, nil); merr != nil {
						cancel()
					}
				})
			}
			err = r.Run(rctx)
			cancel()
			wg.Wait()
			return errors.Join(err, merr)
		},
	}
	dbFlag(c, &url)
	a.kafkaFlags(c)
	tableFlag(c, &table)
	c.Flags().StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus /metrics (and /healthz) on this address (empty: off)")
	c.Flags().IntVar(&r.BatchSize, "batch-size", outboxstore.BatchSize, "rows read per round")
	c.Flags().DurationVar(&r.PollInterval, "poll-interval", outboxstore.PollInterval, "look at the table this often when no NOTIFY arrives")
	c.Flags().DurationVar(&r.LeaderRetry, "leader-retry", outboxstore.LeaderRetry, "how often a standby tries to take over")
	c.Flags().IntVar(&r.MaxAttempts, "max-attempts", outboxstore.MaxAttempts, "publishes Kafka refuses for the record itself (too large, invalid) before a row fails; outages never count")
	c.Flags().DurationVar(&r.KeepPublished, "keep-published", 0, "keep published rows this long instead of deleting them at once")
	c.Flags().BoolVar(&r.ExactlyOnce, "exactly-once", false, "publish each round in a Kafka transaction: read_committed readers get every event exactly once (slower; see outbox.Relay)")
	c.Flags().StringVar(&r.TransactionalID, "transactional-id", "", "with --exactly-once: Kafka transactional.id and progress-mark group (empty: derived from the database and table)")
	return c
}

func newOutboxListCmd(a *app) *cobra.Command {
	var url, table, state string
	var failed, asJSON bool
	var limit int
	c := &cobra.Command{
		Use:   "list",
		Short: "List outbox rows (--failed: the ones that need an operator)",
		Long: `List outbox rows in id order: pending rows waiting for the relay, failed rows
(Kafka refused the record itself --max-attempts times: too large, invalid;
they stay until retried) and, with --keep-published, published ones. Reads
only. ATTEMPTS counts every failed publish, outages included; REJECTIONS only
the refusals that fail a row. NOT BEFORE is the time the event was delayed to
(outbox.Message.NotBefore); NEXT TRY is when the relay reads a pending row
again, after a failed publish or until its NOT BEFORE (times in UTC, by the
database's clock; "-" for none).`,
		Example: `  idem outbox list --failed
  idem outbox list --state pending --limit 20 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if failed {
				if state != "" && state != outboxstore.StateFailed {
					return errors.New("--failed and --state " + state + " contradict each other")
				}
				state = outboxstore.StateFailed
			}
			ctx := cmd.Context()
			pool, err := openPool(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := outboxstore.List(ctx, pool, outboxstore.ListOptions{Table: table, State: state, Limit: limit})
			if err != nil {
				return err
			}
			if asJSON {
				return outboxJSON(a, rows)
			}
			if len(rows) == 0 {
				fmt.Fprintln(a.out, "no outbox rows")
				return nil
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tTOPIC\tKEY\tBYTES\tATTEMPTS\tREJECTIONS\tNOT BEFORE\tNEXT TRY\tAGE\tLAST ERROR")
			for _, r := range rows {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", r.ID, r.State, r.Topic, truncate(showKey(r.Key), 40),
					r.ValueSize, r.Attempts, r.Rejections, fmtTime(r.NotBefore), fmtTime(r.RetryAt), age(r.CreatedAt), orDash(truncate(r.LastError, 80)))
			}
			return tw.Flush()
		},
	}
	dbFlag(c, &url)
	tableFlag(c, &table)
	c.Flags().BoolVar(&failed, "failed", false, "only failed rows (same as --state failed)")
	c.Flags().StringVar(&state, "state", "", "only rows in this state: pending, published or failed")
	c.Flags().IntVar(&limit, "limit", 100, "most rows to print, lowest ids first")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func outboxJSON(a *app, rows []outboxstore.Row) error {
	type row struct {
		ID          int64     `json:"id"`
		EventID     string    `json:"event_id"`
		State       string    `json:"state"`
		Topic       string    `json:"topic"`
		Key         string    `json:"key"`
		Bytes       int       `json:"bytes"`
		Attempts    int       `json:"attempts"`
		Rejections  int       `json:"rejections"`
		LastError   string    `json:"last_error,omitempty"`
		CreatedAt   time.Time `json:"created_at"`
		NotBefore   time.Time `json:"not_before,omitzero"`
		RetryAt     time.Time `json:"retry_at,omitzero"`
		PublishedAt time.Time `json:"published_at,omitzero"`
	}
	out := []row{}
	for _, r := range rows {
		out = append(out, row{ID: r.ID, EventID: r.EventID, State: r.State, Topic: r.Topic, Key: showKey(r.Key), Bytes: r.ValueSize,
			Attempts: r.Attempts, Rejections: r.Rejections, LastError: r.LastError, CreatedAt: r.CreatedAt, NotBefore: r.NotBefore,
			RetryAt: r.RetryAt, PublishedAt: r.PublishedAt})
	}
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

func newOutboxRetryCmd(a *app) *cobra.Command {
	var url, table string
	c := &cobra.Command{
		Use:   "retry ID...",
		Short: "Make failed outbox rows pending again (fix their cause first)",
		Long: `Make the failed rows with these ids (from idem outbox list --failed) pending
again, with their attempts and rejections reset, and wake the relay. Rows that are not failed
are left alone and reported.`,
		Example: `  idem outbox retry 1042 1043`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids := make([]int64, 0, len(args))
			for _, s := range args {
				id, err := strconv.ParseInt(s, 10, 64)
				if err != nil || id <= 0 {
					return fmt.Errorf("%q is not an outbox row id (a positive integer from idem outbox list)", s)
				}
				ids = append(ids, id)
			}
			ctx := cmd.Context()
			pool, err := openPool(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			done, err := outboxstore.Retry(ctx, pool, table, ids...)
			if err != nil {
				return err
			}
			retried := map[int64]bool{}
			for _, id := range done {
				retried[id] = true
				fmt.Fprintf(a.out, "%d: pending again\n", id)
			}
			for _, id := range ids {
				if !retried[id] {
					fmt.Fprintf(a.out, "%d: not a failed row; left alone\n", id)
				}
			}
			if len(done) == 0 {
				return fmt.Errorf("none of the %d ids is a failed row", len(ids))
			}
			return nil
		},
	}
	dbFlag(c, &url)
	tableFlag(c, &table)
	return c
}

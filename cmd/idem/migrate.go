package main

import (
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	idemroot "github.com/idemhq/idem" // the root package; the tests' helper is called idem
	"github.com/idemhq/idem/dedupe"
)

// newMigrateCmd builds `idem migrate`: create or upgrade idem's tables.
func newMigrateCmd(a *app) *cobra.Command {
	var url, table, partitions string
	var outboxTables []string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Create or upgrade every PostgreSQL table idem needs; idempotent",
		Long: `Create or upgrade every table idem keeps in PostgreSQL, as idem.Migrate does:
the inbox (idem_processed, or --table), the ordering tables, the outbox
(idem_outbox, or each --outbox-table), the saga tables, the batch checkpoints,
the deferred messages and the failure index that idem console and
idem dlq --database-url read (idem_dlq_records, idem_dlq_groups,
idem_dlq_versions, idem_dlq_audit). Safe to run again and from several
processes at once. Talks only to PostgreSQL: --database-url, or DATABASE_URL.

--partitioned-inbox (week, the default, or day) makes the inbox range-
partitioned by time, or converts an existing plain inbox to it without
moving a row: the plain table becomes the oldest partition, and the sweeper
then drops partitions instead of deleting rows (docs/partitioned-inbox.md).
Configure the services' stores with dedupe.WithPartitions to match.`,
		Example: `  idem migrate --database-url postgres://idem:secret@db:5432/idem
  DATABASE_URL=postgres://idem@db/idem idem migrate --table billing.idem_processed --outbox-table billing.events
  idem migrate --database-url postgres://idem@db/idem --partitioned-inbox=week`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if url == "" {
				return fmt.Errorf("no database: set --database-url or DATABASE_URL")
			}
			ctx := cmd.Context()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				return fmt.Errorf("database: %w", err)
			}
			defer pool.Close()
			var inbox []dedupe.PostgresOption
			if table != "" {
				inbox = append(inbox, dedupe.WithTable(table))
			}
			switch partitions {
			case "":
			case "day":
				inbox = append(inbox, dedupe.WithPartitions(24*time.Hour))
			case "week":
				inbox = append(inbox, dedupe.WithPartitions(7*24*time.Hour))
			default:
				return fmt.Errorf("--partitioned-inbox %q: want day or week", partitions)
			}
			opts := []idemroot.MigrateOption{idemroot.Inbox(inbox...)}
			for _, t := range outboxTables {
				opts = append(opts, idemroot.OutboxTable(t))
			}
			start := time.Now()
			if err := idemroot.Migrate(ctx, pool, opts...); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "idem: schema up to date (%s)\n", time.Since(start).Round(time.Millisecond))
			return nil
		},
	}
	dbFlag(cmd, &url)
	cmd.Flags().StringVar(&table, "table", "", "inbox table name, optionally schema-qualified (default idem_processed)")
	cmd.Flags().StringVar(&partitions, "partitioned-inbox", "", "partition the inbox by time, a partition a week or a day (week, day; alone: week); converts a plain inbox in place")
	cmd.Flags().Lookup("partitioned-inbox").NoOptDefVal = "week"
	cmd.Flags().StringArrayVar(&outboxTables, "outbox-table", nil, "outbox table name, optionally schema-qualified; repeat for several (default idem_outbox)")
	return cmd
}

package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/internal/tables"
)

// newCheckpointCmd builds `idem checkpoint status|reset`. It is
// self-contained: its flags and database handling live in this file.
func newCheckpointCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "checkpoint",
		Short: "Show and move the checkpoints of resumable batch jobs",
		Long: `Show and move the checkpoints of batch jobs run with package checkpoint.

Each job has one row in idem_checkpoint: the key (cursor) of the last row of
its last committed chunk, advanced in the same transaction as the chunk's
effects. A job resumes after that cursor.`,
		Example: `  idem checkpoint status
  idem checkpoint reset nightly-invoices --yes`,
	}
	c.AddCommand(newCheckpointStatusCmd(a), newCheckpointResetCmd(a))
	return c
}

// checkpointDB adds --database-url (env DATABASE_URL, which the help does not
// echo, since it may hold a password) to c and returns a function that opens
// the pool.
func checkpointDB(c *cobra.Command) func(*cobra.Command) (*pgxpool.Pool, error) {
	var url string
	dbFlag(c, &url)
	return func(cmd *cobra.Command) (*pgxpool.Pool, error) { return openPool(cmd.Context(), url) }
}

// checkpointHint adds the fix to an error about a missing idem_checkpoint
// table (SQLSTATE 42P01).
func checkpointHint(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return fmt.Errorf("%w (create it with `idem migrate` or idem.Migrate)", err)
	}
	return err
}

func newCheckpointStatusCmd(_ *app) *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use:   "status [job]",
		Short: "Show every job's checkpoint, or one job's",
		Long: `Show each job's cursor (the key after which it resumes; empty: the start), the
rows and chunks it committed since it was created or reset, when it last
committed and whether its last run reached the end. Reads only.`,
		Example: `  idem checkpoint status
  idem checkpoint status nightly-invoices --json`,
		Args: cobra.MaximumNArgs(1),
	}
	open := checkpointDB(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		pool, err := open(cmd)
		if err != nil {
			return err
		}
		defer pool.Close()
		var states []tables.Checkpoint
		if len(args) == 1 {
			s, err := tables.GetCheckpoint(cmd.Context(), pool, args[0])
			if err != nil {
				return checkpointHint(err)
			}
			states = []tables.Checkpoint{s}
		} else if states, err = tables.ListCheckpoints(cmd.Context(), pool); err != nil {
			return checkpointHint(err)
		}
		out := cmd.OutOrStdout()
		if asJSON {
			enc := json.NewEncoder(out)
			enc.SetIndent("", "  ")
			if states == nil {
				states = []tables.Checkpoint{}
			}
			return enc.Encode(states)
		}
		if len(states) == 0 {
			fmt.Fprintln(out, "no checkpoints")
			return nil
		}
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "JOB\tCURSOR\tROWS\tCHUNKS\tUPDATED\tFINISHED")
		for _, s := range states {
			fin := "no"
			if !s.FinishedAt.IsZero() {
				fin = s.FinishedAt.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%q\t%d\t%d\t%s\t%s\n", s.Job, s.Cursor, s.Rows, s.Chunks, s.UpdatedAt.UTC().Format(time.RFC3339), fin)
		}
		return tw.Flush()
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

func newCheckpointResetCmd(_ *app) *cobra.Command {
	var to string
	var yes bool
	c := &cobra.Command{
		Use:   "reset <job>",
		Short: "Move a job's checkpoint back to the start (or to --to)",
		Long: `Set the job's cursor to --to (default empty: the start) and zero its counts, so
its next run processes every row after that cursor again. It waits for a chunk
in progress (it takes the job's advisory lock). Rows already processed are not
undone: make sure processing them again is what you want. Asks for
confirmation unless --yes.`,
		Example: `  idem checkpoint reset nightly-invoices
  idem checkpoint reset nightly-invoices --to 184000 --yes`,
		Args: cobra.ExactArgs(1),
	}
	open := checkpointDB(c)
	c.RunE = func(cmd *cobra.Command, args []string) error {
		job := args[0]
		pool, err := open(cmd)
		if err != nil {
			return err
		}
		defer pool.Close()
		s, err := tables.GetCheckpoint(cmd.Context(), pool, job)
		if err != nil {
			return checkpointHint(err)
		}
		out := cmd.OutOrStdout()
		if !yes {
			fmt.Fprintf(out, "reset job %s from cursor %q (%d rows done) to %q? [y/N] ", job, s.Cursor, s.Rows, to)
			line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
			if ans := strings.ToLower(strings.TrimSpace(line)); ans != "y" && ans != "yes" {
				fmt.Fprintln(out)
				return errors.New("reset not confirmed; nothing changed")
			}
		}
		if err := tables.ResetCheckpoint(cmd.Context(), pool, job, to); err != nil {
			return err
		}
		fmt.Fprintf(out, "job %s: cursor %q -> %q\n", job, s.Cursor, to)
		return nil
	}
	c.Flags().StringVar(&to, "to", "", "cursor to resume after (default: the start)")
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

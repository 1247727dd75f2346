package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/internal/failidx"
)

func newJobsCmd(a *app) *cobra.Command {
	var resume bool
	var cancel int64
	var limit int
	var asJSON bool
	c := &cobra.Command{
		Use:   "jobs",
		Short: "List the failure index's replay and edit jobs; resume or cancel them",
		Long: `List the failure index's jobs, newest first: every replay and edit-and-retry
(from the console or from dlq replay --database-url) claims its records and
publishes them as a job, so that no record is published twice, whoever acts
beside it or crashes.

A job runs in the process that started it. One whose process stopped is
handed back; one whose process died keeps its heartbeat, which ages. A
running idem console takes either over within seconds; --resume takes them
over here and finishes them (a record whose send had started is looked for
in its destination first, never sent twice). --cancel ID stops a job: the
records it has not published go back to unresolved.

Needs the failure index: --database-url or DATABASE_URL.`,
		Example: `  idem dlq jobs --database-url postgres://idem@db/idem
  idem dlq jobs --resume
  idem dlq jobs --cancel 42`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !a.useIndex() {
				return errors.New("dlq jobs works on the failure index: set --database-url or DATABASE_URL (and no --from-topic)")
			}
			if resume && cancel != 0 {
				return errors.New("give --resume or --cancel, not both")
			}
			ctx := cmd.Context()
			s, closeDB, err := a.openIndex(ctx)
			if err != nil {
				return err
			}
			defer closeDB()
			if resume || cancel != 0 {
				client, err := a.producerClient()
				if err != nil {
					return err
				}
				defer client.Close()
				act := failidx.NewActions(s, client)
				if cancel != 0 {
					j, err := act.CancelJob(ctx, a.actorName(), cancel)
					if err != nil {
						return err
					}
					fmt.Fprintf(a.out, "job %d: %s (%d of %d published)\n", j.ID, jobState(j), j.Done, j.Claimed)
					return nil
				}
				ids, err := act.ResumeJobs(ctx)
				if err != nil {
					return err
				}
				if len(ids) == 0 {
					fmt.Fprintln(a.out, "no job to resume: every running job's process is alive")
				}
				var errs []error
				for _, id := range ids {
					j, err := act.RunJob(ctx, id)
					fmt.Fprintf(a.out, "resumed job %d: %s (%d of %d published)\n", id, jobState(j), j.Done, j.Claimed)
					errs = append(errs, err)
				}
				return errors.Join(errs...)
			}
			m, err := a.masker()
			if err != nil {
				return err
			}
			js, _, err := s.Jobs(ctx, "", limit)
			if err != nil {
				return err
			}
			js = maskJobs(m, js)
			if asJSON {
				return writeJSON(a.out, map[string]any{"view": "index", "jobs": js})
			}
			a.indexView()
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tACTION\tACTOR\tSTATE\tPUBLISHED\tCLAIMED\tSKIPPED\tSTARTED\tDETAIL")
			for _, j := range js {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", j.ID, j.Action, text(j.Actor), jobState(j), j.Done, j.Claimed, j.Skipped,
					fmtTime(j.CreatedAt), truncate(j.Detail, 60))
			}
			return tw.Flush()
		},
	}
	c.Flags().BoolVar(&resume, "resume", false, "take over and finish the running jobs no process runs")
	c.Flags().Int64Var(&cancel, "cancel", 0, "cancel job ID: what it has not published goes back to unresolved")
	c.Flags().IntVar(&limit, "limit", 50, "jobs to list (at most 1000)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

// jobState is a job's state, with whether a process holds a running one.
func jobState(j failidx.Job) string {
	switch {
	case j.State != failidx.JobRunning:
		return string(j.State)
	case j.CancelRequested:
		return "running (cancelling)"
	case j.Owner == "":
		return "running (no process: resume it)"
	}
	return "running"
}

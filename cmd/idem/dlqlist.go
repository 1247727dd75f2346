package main

import (
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
)

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

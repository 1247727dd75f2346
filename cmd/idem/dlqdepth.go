package main

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
)

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

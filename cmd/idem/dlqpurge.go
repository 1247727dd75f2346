package main

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

func newPurgeCmd(a *app) *cobra.Command {
	var sel dlqTopic
	var yes bool
	c := &cobra.Command{
		Use:   "purge",
		Short: "Mark every pending dead-letter record as dealt with (depth 0)",
		Long: `Commit the admin group at the end of the topic so nothing is pending. Records stay
in the topic until retention deletes them. Asks for confirmation unless --yes.`,
		Example: `  idem dlq purge -t payments.billing.dlq
  idem dlq purge --source payments --group billing --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl, topic, err := a.openDLQ(sel)
			if err != nil {
				return err
			}
			defer cl.Close()
			a.topicView(topic)
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
	dlqTopicFlags(c, &sel)
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

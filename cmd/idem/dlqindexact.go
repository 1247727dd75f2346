package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/forward"
)

// selection builds an action's selection: --id, or the topic and filter
// flags (at least one of them, so that no action selects the whole index by
// accident).
func selection(t dlqTopic, filter, status string, ids []int64) (failidx.Selection, error) {
	if len(ids) > 0 {
		if filter != "" || t.topic != "" || t.source != "" {
			return failidx.Selection{}, errors.New("give either --id or --topic/--filter, not both")
		}
		return failidx.Selection{IDs: ids}, nil
	}
	f, err := indexFilter(t, filter, status)
	if err != nil {
		return failidx.Selection{}, err
	}
	if f.Topic == "" && filter == "" {
		return failidx.Selection{}, errors.New("select records with --id, or --topic (or --source and --group) and/or --filter")
	}
	return failidx.Selection{Filter: &f}, nil
}

// indexReplay replays from the failure index. The replay claims its
// records and runs as a job in this process; interrupted, the job is handed
// back, and a console (or idem dlq jobs --resume) finishes it.
func indexReplay(ctx context.Context, a *app, sel failidx.Selection, to string, tier int, rate float64, reason string, dryRun bool, allowed []string) error {
	if tier != 0 {
		return errors.New("--tier: with a database, the tier is taken from the --to topic's name (<topic>.<group>.retry.<n>, else 1)")
	}
	if to == forward.ReplayToSource {
		to = ""
	}
	s, closeDB, err := a.openIndex(ctx)
	if err != nil {
		return err
	}
	defer closeDB()
	if sel.Filter != nil {
		if err := a.checkIndexed(ctx, s, sel.Filter.Topic); err != nil {
			return err
		}
	}
	client, err := a.producerClient()
	if err != nil {
		return err
	}
	defer client.Close()
	act := failidx.NewActions(s, client)
	act.ReplayTopics = allowed
	a.indexView()
	if dryRun {
		return indexDryRun(ctx, a, act, sel, to)
	}
	res, err := act.Replay(ctx, a.actorName(), sel, to, int(rate), reason)
	if err != nil {
		switch {
		case errors.Is(err, dlq.ErrUnknownTopic) && (to == "retry" || to == "origin"):
			return fmt.Errorf("%w (--to takes source or a topic name: name the retry tier, e.g. <topic>.<group>.retry.1)", err)
		case errors.Is(err, context.Canceled):
			return fmt.Errorf("interrupted after %d replayed: the job is handed back unfinished; idem dlq jobs --resume (or a running idem console) finishes it", res.Done)
		}
		return fmt.Errorf("%w (replayed %d before stopping)", err, res.Done)
	}
	dest := to
	if dest == "" {
		dest = forward.ReplayToSource
	}
	fmt.Fprintf(a.out, "replayed %d of %d selected records to %s\n", res.Done, res.Matched, dest)
	reportSkipped(a.out, res)
	switch {
	case res.Done == 0:
		return fmt.Errorf("nothing replayed: %d records selected, none unresolved and replayable", res.Matched)
	case len(res.Errors) > 0:
		return fmt.Errorf("replayed %d of %d selected records; %d could not be replayed (above) and stay unresolved", res.Done, res.Matched, len(res.Errors))
	}
	return nil
}

// producerClient connects the Kafka client the index's actions publish
// through.
func (a *app) producerClient() (sarama.Client, error) {
	cfg, brokers, err := a.saramaConfig()
	if err != nil {
		return nil, err
	}
	client, err := sarama.NewClient(brokers, failidx.ProducerConfig(cfg))
	if err != nil {
		return nil, fmt.Errorf("connect to %v: %w", brokers, err)
	}
	return client, nil
}

// reportSkipped prints what an index action left alone.
func reportSkipped(w io.Writer, res failidx.Result) {
	if n := res.Skipped - len(res.SkippedStubs); n > 0 {
		fmt.Fprintf(w, "%d skipped (not in a status the action applies to)\n", n)
	}
	if n := len(res.SkippedStubs); n > 0 {
		fmt.Fprintf(w, "%s never replayed (value omitted): ids %s\n", plural(int64(n), "stub"), idList(res.SkippedStubs))
	}
	for _, e := range res.Errors {
		fmt.Fprintf(w, "not replayed: %s\n", text(e))
	}
	fmt.Fprintln(w, "records not selected keep their status; the action is in the audit log")
}

func idList(ids []int64) string {
	var parts []string
	for i, id := range ids {
		if i == 10 {
			parts = append(parts, fmt.Sprintf("… (%d more)", len(ids)-10))
			break
		}
		parts = append(parts, strconv.FormatInt(id, 10))
	}
	return strings.Join(parts, ", ")
}

// indexDryRun counts what a replay would do, in the database (no value is
// read, however many records are selected), and checks its destinations.
func indexDryRun(ctx context.Context, a *app, act *failidx.Actions, sel failidx.Selection, to string) error {
	p, err := act.PlanReplay(ctx, sel, to)
	if err != nil {
		return err
	}
	dest := to
	if dest == "" {
		dest = "source"
	}
	fmt.Fprintf(a.out, "dry run: would replay %d of %d selected records to %s; nothing sent or changed\n", p.Send, p.Selected, dest)
	if p.Other > 0 {
		fmt.Fprintf(a.out, "%d selected records are not unresolved and would be skipped\n", p.Other)
	}
	if p.Stubs > 0 {
		fmt.Fprintf(a.out, "%s would not be replayed (value omitted): ids %s\n", plural(int64(p.Stubs), "stub"), idList(p.StubIDs))
	}
	fmt.Fprintln(a.out, "records not selected stay unresolved")
	if p.Send == 0 {
		return fmt.Errorf("nothing would be replayed: %d records selected, none unresolved and replayable", p.Selected)
	}
	return nil
}

// newStatusCmd builds `idem dlq resolve` and `idem dlq archive`.
func newStatusCmd(a *app, name string) *cobra.Command {
	var sel dlqTopic
	var filter, status, reason string
	var ids []int64
	short := map[string]string{
		"resolve": "Mark dead letters in the failure index resolved (nothing is sent)",
		"archive": "Archive dead letters in the failure index, with a reason (nothing is sent)",
	}[name]
	c := &cobra.Command{
		Use:   name,
		Short: short,
		Long: short + `.

Needs the failure index: --database-url or DATABASE_URL. Select records by
--id (repeatable) or by --topic (or --source and --group) and --filter; with
a filter, --status narrows it (default unresolved). The action is written to
the index's audit log under --actor (default $USER).`,
		Example: fmt.Sprintf(`  idem dlq %s --database-url postgres://idem@db/idem --id 42 --id 43 --reason "fixed upstream"
  idem dlq %s -t payments.billing.dlq --filter fingerprint=3fa2 --reason "test data"`, name, name),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !a.useIndex() {
				return fmt.Errorf("dlq %s works on the failure index: set --database-url or DATABASE_URL (and no --from-topic)", name)
			}
			s, err := selection(sel, filter, status, ids)
			if err != nil {
				return err
			}
			store, closeDB, err := a.openIndex(cmd.Context())
			if err != nil {
				return err
			}
			defer closeDB()
			if s.Filter != nil {
				if err := a.checkIndexed(cmd.Context(), store, s.Filter.Topic); err != nil {
					return err
				}
			}
			a.indexView()
			act := failidx.NewActions(store, nil)
			var res failidx.Result
			if name == "resolve" {
				res, err = act.Resolve(cmd.Context(), a.actorName(), s, reason)
			} else {
				res, err = act.Archive(cmd.Context(), a.actorName(), s, reason)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "%sd %d of %d selected records\n", name, res.Done, res.Matched)
			reportSkipped(a.out, res)
			if res.Matched == 0 {
				return errors.New("no record matched")
			}
			return nil
		},
	}
	dlqTopicFlags(c, &sel)
	c.Flags().Int64SliceVar(&ids, "id", nil, "record id in the failure index (repeatable; see dlq list)")
	c.Flags().StringVar(&filter, "filter", "", "kind=…,error~=…,key=…,fingerprint=… (all must match)")
	c.Flags().StringVar(&status, "status", "unresolved", "with --filter: statuses to act on, comma-separated, or any")
	c.Flags().StringVar(&reason, "reason", "", "why (required by archive), kept in the record and the audit log")
	return c
}

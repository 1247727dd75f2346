package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/forward"
)

func newReplayCmd(a *app) *cobra.Command {
	var sel dlqTopic
	var to, filter string
	var rate float64
	var tier int
	var dryRun, drop bool
	var ids []int64
	var reason, status string
	var allowed []string
	c := &cobra.Command{
		Use:   "replay",
		Short: "Republish pending dead-letter records to their source topic or to a topic you name",
		Long: `Republish pending dead-letter records, keeping key, value and original headers
(including idempotency-key, so already-handled records are dropped as duplicates).

--to says where records go:
  source (default)  each record's idem-original-topic, as a fresh record
                    (idem-* headers removed), to its original partition
  TOPIC             a retry tier of each record's origin for its group,
                    e.g. payments.billing.retry.1: the record keeps its
                    idem-* history, due now, with idem-tier from --tier
                    (default: n of <topic>.<group>.retry.<n>); any other
                    topic must be listed with --replay-topic
idem never guesses tier names and never creates a topic. A --to topic that
does not exist is an error before anything is read; with source, replay stops
at the first record whose original topic does not exist, and that record
stays pending (list still shows it).

Without a database, "pending" is one committed offset per partition (the
admin group): replay handles the records pending when it starts and commits
the admin group past all of them. So a replay that would leave records
unsent, records the --filter does not match or stubs, is REFUSED unless
--drop-unmatched-from-pending says to drop them from pending (they stay in
the topic; show still finds them). A replay that matches nothing exits 1.
--dry-run says what a real run would send and drop. A stub (a record
dead-lettered without its value) is never replayed.

With --database-url (or DATABASE_URL) replay works on the failure index
instead (idem console's index): each record has its own status, a replay of
a subset leaves the others unresolved, and every replay is audited.

--filter terms (comma-separated, all must match):
  kind=retriable|permanent|panic|missing-key|invalid-key|decode|timeout
  error~=REGEXP      (matched anywhere in idem-error)
  key=K              (record key, derived idempotency key or idempotency-key header)
  fingerprint=PREFIX (as dlq list shows it)`,
		Example: `  idem dlq replay -t payments.billing.dlq --dry-run
  idem dlq replay --source payments --group billing --filter kind=timeout --rate 50
  idem dlq replay -t payments.billing.dlq --to payments.billing.retry.1
  idem dlq replay --database-url postgres://idem@db/idem --id 42 --id 43 --reason "ledger fixed"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.useIndex() {
				if drop {
					return errors.New("--drop-unmatched-from-pending: with a database, records not replayed stay unresolved; nothing to drop")
				}
				if strings.TrimSpace(to) == "" {
					return errors.New("--to is empty: give source or a topic name")
				}
				if rate < 0 || rate != math.Trunc(rate) || rate > math.MaxInt32 {
					// Truncating 0.5 to 0 would mean no cap at all.
					return fmt.Errorf("--rate %v: with a database, give whole records a second (1 or more; 0 for no cap)", rate)
				}
				s, err := selection(sel, filter, status, ids)
				if err != nil {
					return err
				}
				return indexReplay(cmd.Context(), a, s, to, tier, rate, reason, dryRun, allowed)
			}
			if len(ids) > 0 || reason != "" || cmd.Flags().Changed("status") {
				return errors.New("--id, --reason and --status need the failure index: set --database-url or DATABASE_URL (and no --from-topic)")
			}
			f, err := dlq.ParseFilter(filter)
			if err != nil {
				return err
			}
			if strings.TrimSpace(to) == "" {
				return errors.New("--to is empty: give source or a topic name")
			}
			if rate < 0 {
				return fmt.Errorf("--rate %v: must be >= 0", rate)
			}
			if tier < 0 {
				return fmt.Errorf("--tier %d: must be >= 1 (0: from the topic name)", tier)
			}
			if tier > 0 && to == forward.ReplayToSource {
				return errors.New("--tier applies to a named --to topic, not to source")
			}
			cl, topic, err := a.openDLQ(sel)
			if err != nil {
				return err
			}
			defer cl.Close()
			dest := to
			opts := dlq.ReplayOptions{Topic: topic, To: dest, Tier: tier, Filter: f, Rate: rate, DryRun: dryRun, DropUnmatched: drop, AllowedTopics: allowed}
			a.topicView(topic)
			tty := isTerminal(a.out)
			if tty {
				opts.Progress = func(done, total int64) { progressBar(a.out, done, total) }
			}
			res, err := cl.Replay(cmd.Context(), opts)
			if tty && res.Pending > 0 {
				fmt.Fprintln(a.out)
			}
			return replayReport(a, topic, dest, opts, res, err)
		},
	}
	dlqTopicFlags(c, &sel)
	c.Flags().StringVar(&to, "to", forward.ReplayToSource, "destination: source (each record's idem-original-topic) or an existing topic name, e.g. a retry tier")
	c.Flags().IntVar(&tier, "tier", 0, "idem-tier written with a named --to topic (default: n of <topic>.<group>.retry.<n>, else 1)")
	c.Flags().StringVar(&filter, "filter", "", "kind=…,error~=…,key=…,fingerprint=… (all must match)")
	c.Flags().Float64Var(&rate, "rate", 0, "max records per second (0 = unlimited; with a database, a whole number)")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "count what would be replayed and dropped; send and commit nothing")
	c.Flags().Int64SliceVar(&ids, "id", nil, "with a database: record id in the failure index (repeatable)")
	c.Flags().StringVar(&reason, "reason", "", "with a database: why, kept in the record and the audit log")
	c.Flags().StringVar(&status, "status", "unresolved", "with a database and --filter: statuses to select (only unresolved records are sent)")
	c.Flags().BoolVar(&drop, "drop-unmatched-from-pending", false, "without a database: allow a replay that leaves records unsent (not matched by --filter, or stubs); they stop being pending")
	c.Flags().StringSliceVar(&allowed, "replay-topic", nil, "topic --to may name besides each record's origin and its group's retry tiers (repeatable)")
	return c
}

// stubList renders stub positions for a message, the first 10 of them.
func stubList(ps []dlq.Position) string {
	var b strings.Builder
	for i, p := range ps {
		if i == 10 {
			fmt.Fprintf(&b, ", … (%d more)", len(ps)-10)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "partition %d offset %d", p.Partition, p.Offset)
	}
	return b.String()
}

// replayReport prints what an offset-model replay did, or turns its refusal
// into an error that says what to do.
func replayReport(a *app, topic string, dest string, opts dlq.ReplayOptions, res dlq.ReplayResult, err error) error {
	stubs := int64(len(res.Stubs))
	switch {
	case err == nil && res.Pending == 0:
		return fmt.Errorf("nothing pending in %s: nothing replayed", topic)
	case errors.Is(err, dlq.ErrNothingMatched):
		msg := fmt.Sprintf("no pending record of %s matched: %d pending, %d not matched by the filter", topic, res.Pending, res.Skipped)
		if stubs > 0 {
			msg += fmt.Sprintf(", %s (never replayed: %s)", plural(stubs, "stub"), stubList(res.Stubs))
		}
		return errors.New(msg + "; nothing sent or committed")
	case errors.Is(err, dlq.ErrUnmatched):
		msg := fmt.Sprintf("refused: %d of %d pending records of %s match", res.Replayed, res.Pending, topic)
		if res.Skipped > 0 {
			msg += fmt.Sprintf("; %d not matched by the filter", res.Skipped)
		}
		if stubs > 0 {
			msg += fmt.Sprintf("; %s never replayed (value omitted: %s)", plural(stubs, "stub"), stubList(res.Stubs))
		}
		return errors.New(msg + ". Without a database, pending is one offset per partition: this replay would make them no longer pending. " +
			"Give --drop-unmatched-from-pending to do so, or --database-url to replay from the failure index, which keeps them unresolved. Nothing sent or committed")
	case err != nil:
		if errors.Is(err, dlq.ErrUnknownTopic) && (dest == "retry" || dest == "origin") {
			return fmt.Errorf("%w (--to takes source or a topic name: name the retry tier, e.g. <topic>.<group>.retry.1)", err)
		}
		return fmt.Errorf("%w (replayed %d before stopping)", err, res.Replayed)
	}
	if opts.DryRun {
		fmt.Fprintf(a.out, "dry run: would replay %d of %d pending records to %s (%d skipped by the filter); nothing sent or committed\n",
			res.Replayed, res.Pending, dest, res.Skipped)
		if stubs > 0 {
			fmt.Fprintf(a.out, "%s would not be replayed (value omitted): %s\n", plural(stubs, "stub"), stubList(res.Stubs))
		}
		if unsent := res.Skipped + stubs; unsent > 0 {
			fmt.Fprintf(a.out, "warning: %d records would not be sent and would NO LONGER BE PENDING after this replay; a real run refuses unless --drop-unmatched-from-pending\n", unsent)
		}
		return nil
	}
	fmt.Fprintf(a.out, "replayed %d of %d pending records to %s\n", res.Replayed, res.Pending, dest)
	if res.Skipped > 0 {
		fmt.Fprintf(a.out, "%d records skipped by the filter are no longer pending (--drop-unmatched-from-pending; still in %s)\n", res.Skipped, topic)
	}
	if stubs > 0 {
		fmt.Fprintf(a.out, "%s not replayed (value omitted) and no longer pending: %s\n", plural(stubs, "stub"), stubList(res.Stubs))
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func progressBar(w io.Writer, done, total int64) {
	const width = 30
	n := width
	if total > 0 {
		n = int(done * width / total)
	}
	fmt.Fprintf(w, "\r[%s%s] %d/%d", strings.Repeat("#", n), strings.Repeat(".", width-n), done, total)
}

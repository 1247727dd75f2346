package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/internal/control"
)

// The live controls from a shell: idem pause, idem resume, idem redrive
// start|list|show|cancel and idem fleet. They change and read the same rows
// as the console (internal/control), each change claimed in its statement
// and audited under the OS user (with --actor beside it).

// controls holds the flags of the live controls' commands.
type controls struct {
	a       *app
	db      string
	group   string
	topic   string
	part    int32
	reason  string
	asJSON  bool
	perHour int
}

// dbFlags adds --database-url and --actor to c.
func (k *controls) dbFlags(c *cobra.Command) {
	dbFlag(c, &k.db)
	c.Flags().StringVar(&k.a.actor, "actor", "", "who acts, recorded in the audit log beside the OS user the CLI runs as")
	envFlag(c.Flags(), "actor", "IDEM_ACTOR")
}

// targetFlags adds --group, --topic and --partition to c.
func (k *controls) targetFlags(c *cobra.Command, partition string) {
	c.Flags().StringVarP(&k.group, "group", "g", "", "the consumer group (required)")
	c.Flags().StringVarP(&k.topic, "topic", "t", "", "the topic (required)")
	c.Flags().Int32VarP(&k.part, "partition", "p", control.AllPartitions, partition)
	_ = c.MarkFlagRequired("group")
	_ = c.MarkFlagRequired("topic")
}

// admin opens the database of the controls; it creates nothing.
func (k *controls) admin(ctx context.Context) (control.Admin, func(), error) {
	pool, err := openPool(ctx, k.db)
	if err != nil {
		return control.Admin{}, nil, err
	}
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('idem_control_pauses') IS NOT NULL`).Scan(&exists); err != nil {
		pool.Close()
		return control.Admin{}, nil, fmt.Errorf("database: %w", err)
	}
	if !exists {
		pool.Close()
		return control.Admin{}, nil, errors.New("this database has no live controls (idem_control_pauses): run `idem migrate`")
	}
	return control.Admin{DB: pool, MaxRedrivesPerHour: k.perHour}, pool.Close, nil
}

func newPauseCmd(a *app) *cobra.Command {
	return newPauseResumeCmd(a, true)
}

func newResumeCmd(a *app) *cobra.Command {
	return newPauseResumeCmd(a, false)
}

func newPauseResumeCmd(a *app, on bool) *cobra.Command {
	k := &controls{a: a}
	c := &cobra.Command{
		Use:   "pause",
		Short: "Pause a topic or a partition of a consumer group: no member handles it until resumed",
		Long: `Pause a topic, or one partition of it (--partition), for a consumer group.
Every member of the group that runs with consumer.Config.Controls stops
handling it within a second (LISTEN/NOTIFY; a re-read every 30 s besides):
its fetching is paused (idem_partitions_paused{reason="operator"}), a message
already taken stays unhandled, and its offsets stay. The pause is kept in
PostgreSQL, so it holds across restarts and rebalances. Pausing a topic
pauses its retry tiers and deferred topic for the group too; a partition's
pause holds that partition of them. idem resume ends it; idem fleet lists
the pauses.

The pause is claimed in the statement that makes it (a second pause of the
same thing is refused, naming who paused it) and written to the audit log
with --reason (required), under the OS user with --actor beside it.`,
		Example: `  idem pause --group billing --topic payments --partition 3 --reason "ledger migration"
  idem pause --group billing --topic payments --reason "incident 4711"`,
		Args: cobra.NoArgs,
		RunE: k.withAdmin(func(ctx context.Context, ad control.Admin, _ []string) error {
			p := control.Pause{Group: k.group, Topic: k.topic, Partition: k.part, Reason: k.reason}
			if !on {
				got, err := ad.Resume(ctx, a.actorName(), p)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.out, "resumed %s of group %s (paused by %s at %s: %s)\n", got.What(), got.Group, got.By, fmtTime(got.At), text(got.Reason))
				if k.part != control.AllPartitions {
					if ps, err := ad.Pauses(ctx, k.group); err == nil {
						if still, ok := (control.State{Pauses: ps}).Paused(k.topic, k.part); ok {
							fmt.Fprintf(a.out, "warning: it stays paused: its topic is paused (by %s); idem resume without --partition ends that\n", still.By)
						}
					}
				}
				return nil
			}
			got, err := ad.Pause(ctx, a.actorName(), p)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.out, "paused %s of group %s\n", got.What(), got.Group)
			if w := ad.Unwatched(ctx, k.group); w != "" {
				fmt.Fprintln(a.out, "warning: "+w)
			}
			return nil
		}),
	}
	k.targetFlags(c, "one partition (default: the whole topic)")
	k.dbFlags(c)
	c.Flags().StringVar(&k.reason, "reason", "", "why (kept with the pause and in the audit log; required)")
	if !on {
		c.Use = "resume"
		c.Short = "End an operator's pause of a topic or a partition"
		c.Long = `End the pause of a topic (no --partition) or of one partition of it for a
consumer group: its members handle it again within a second, every record
held meanwhile once. A partition's resume leaves its topic's pause in place
(and the other way round): the command says so. Audited, with --reason
(optional), under the OS user with --actor beside it.`
		c.Example = `  idem resume --group billing --topic payments --partition 3
  idem resume --group billing --topic payments --reason "migration done"`
		c.Flags().Lookup("reason").Usage = "why (written to the audit log)"
	}
	return c
}

// newRedriveCmd builds `idem redrive start|list|show|cancel`.
func newRedriveCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "redrive <command>",
		Short: "Re-drive a window of a consumer group's records under a replay epoch",
		Long: `Re-drive a window: have a consumer group handle its records of a topic again,
from a time or an offset to the end fixed at the request, each under a new
replay epoch. Rewinding the group's offsets would do nothing (the inbox
holds every key); the inbox keys a record by its epoch too, so each key of
the window runs once more, once. The member that owns each partition (a
member with consumer.Config.Controls) holds it, reads the window again,
records its progress, and goes on; a member that dies leaves the rest to
the partition's next owner. Admin only in the console; audited; at most
--max-per-hour re-drives of a group an hour (counted in the database).`,
		Example: `  idem redrive start --group billing --topic payments --from 1h --reason "handler fixed" --dry-run
  idem redrive list --group billing
  idem redrive cancel 7 --reason "wrong window"`,
	}
	c.AddCommand(newRedriveStartCmd(a), newRedriveListCmd(a), newRedriveShowCmd(a), newRedriveCancelCmd(a))
	return c
}

func newRedriveStartCmd(a *app) *cobra.Command {
	k := &controls{a: a}
	var from, until string
	var fromOffset, epoch int64
	var rate int
	var dry bool
	c := &cobra.Command{
		Use:   "start",
		Short: "Start a re-drive (or count its window with --dry-run)",
		Long: `Start a re-drive of --group's records of --topic (every partition, or
--partition), from --from (an RFC 3339 time, or how long ago: 1h, 90m; by
the records' timestamps) or --from-offset (with --partition), to --until
(same forms) or the end of each partition now. Each record is handled
under a new replay epoch (--epoch N re-drives under an earlier one of the
group: what ran in it is not run again). --rate caps the records a second
per partition. --dry-run prints the window and its count and changes
nothing. Refused while a re-drive of the topic runs for the group, and
past --max-per-hour re-drives of the group in the last hour.`,
		Example: `  idem redrive start -g billing -t payments --from 1h --reason "handler fixed" --dry-run
  idem redrive start -g billing -t payments --from 2026-12-04T08:00:00Z --until 2026-12-04T09:00:00Z --reason "handler fixed"
  idem redrive start -g billing -t payments -p 3 --from-offset 1200 --rate 50 --reason "replay partition 3"`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			now := time.Now()
			req := control.RedriveRequest{Group: k.group, Topic: k.topic, Partition: k.part, FromOffset: fromOffset,
				Epoch: epoch, Rate: rate, Reason: k.reason}
			var err error
			if req.From, err = control.ParseWhen(from, now); err != nil {
				return fmt.Errorf("--from %v", err)
			}
			if req.Until, err = control.ParseWhen(until, now); err != nil {
				return fmt.Errorf("--until %v", err)
			}
			ad, closeDB, err := k.admin(ctx)
			if err != nil {
				return err
			}
			defer closeDB()
			cfg, brokers, err := a.saramaConfig()
			if err != nil {
				return err
			}
			client, err := sarama.NewClient(brokers, cfg)
			if err != nil {
				return fmt.Errorf("connect to %v: %w", brokers, err)
			}
			defer client.Close()
			parts, err := control.Window(ctx, client, req)
			if err != nil {
				return err
			}
			var rd control.Redrive
			if dry {
				rd, err = ad.Plan(ctx, a.actorName(), req, parts)
			} else {
				rd, err = ad.StartRedrive(ctx, a.actorName(), req, parts)
			}
			if err != nil {
				return err
			}
			total, _ := rd.Offsets()
			warning := ad.Unwatched(ctx, k.group)
			if k.asJSON {
				return writeJSON(a.out, map[string]any{"dry_run": dry, "redrive": rd, "offsets": total, "warning": warning})
			}
			if dry {
				fmt.Fprintf(a.out, "dry run: the window holds %d records (offsets), to be handled under epoch %d; nothing was changed\n", total, rd.Epoch)
			} else {
				fmt.Fprintf(a.out, "re-drive %d started: %d records (offsets) under epoch %d\n", rd.ID, total, rd.Epoch)
			}
			printParts(a, rd)
			if warning != "" {
				fmt.Fprintln(a.out, "warning: "+warning)
			}
			return nil
		},
	}
	k.targetFlags(c, "one partition (default: every partition)")
	k.dbFlags(c)
	a.kafkaFlags(c)
	f := c.Flags()
	f.StringVar(&from, "from", "", "the window's start: an RFC 3339 time, or how long ago (1h, 90m)")
	f.Int64Var(&fromOffset, "from-offset", -1, "the window's start as an offset (needs --partition), instead of --from")
	f.StringVar(&until, "until", "", "the window's end, exclusive (same forms; default: the end of each partition now)")
	f.Int64Var(&epoch, "epoch", 0, "an earlier re-drive's epoch of the group to re-drive under (default: a new one)")
	f.IntVar(&rate, "rate", 0, "records a second per partition (0: no cap)")
	f.StringVar(&k.reason, "reason", "", "why (kept with the re-drive and in the audit log; required unless --dry-run)")
	f.BoolVar(&dry, "dry-run", false, "print the window and its count; change nothing")
	f.IntVar(&k.perHour, "max-per-hour", control.DefaultMaxRedrivesPerHour, "re-drives of the group allowed in any hour")
	f.BoolVar(&k.asJSON, "json", false, "print JSON")
	return c
}

// printParts prints a re-drive's window and progress per partition.
func printParts(a *app, rd control.Redrive) {
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tSTART\tEND\tNEXT\tDONE\tMEMBER")
	for _, p := range rd.Parts {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%v\t%s\n", p.Partition, p.Start, p.End, p.Next, p.Done, dash(p.Member))
	}
	_ = tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return text(s)
}

func newRedriveListCmd(a *app) *cobra.Command {
	k := &controls{a: a}
	var limit int
	c := &cobra.Command{
		Use:     "list",
		Short:   "List re-drives, newest first, with their progress",
		Example: `  idem redrive list --group billing --json`,
		Args:    cobra.NoArgs,
		RunE: k.withAdmin(func(ctx context.Context, ad control.Admin, _ []string) error {
			rs, err := ad.Redrives(ctx, k.group, limit)
			if err != nil {
				return err
			}
			if k.asJSON {
				return writeJSON(a.out, map[string]any{"redrives": rs})
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tGROUP\tTOPIC\tEPOCH\tSTATE\tOFFSETS DONE\tBY\tSTARTED\tREASON")
			for _, r := range rs {
				total, done := r.Offsets()
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%d/%d\t%s\t%s\t%s\n", r.ID, text(r.Group), text(r.Topic), r.Epoch, r.State, done, total,
					text(r.By), fmtTime(r.CreatedAt), truncate(r.Reason, 40))
			}
			return tw.Flush()
		}),
	}
	c.Flags().StringVarP(&k.group, "group", "g", "", "only this consumer group's")
	c.Flags().IntVar(&limit, "limit", 50, "re-drives to list")
	c.Flags().BoolVar(&k.asJSON, "json", false, "print JSON")
	k.dbFlags(c)
	return c
}

// withAdmin is a RunE that opens the controls' database and runs fn.
func (k *controls) withAdmin(fn func(ctx context.Context, ad control.Admin, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ad, closeDB, err := k.admin(cmd.Context())
		if err != nil {
			return err
		}
		defer closeDB()
		return fn(cmd.Context(), ad, args)
	}
}

// onRedrive is a RunE of show and cancel: fn gets the re-drive id of the
// one argument.
func (k *controls) onRedrive(fn func(ctx context.Context, ad control.Admin, id int64) error) func(*cobra.Command, []string) error {
	return k.withAdmin(func(ctx context.Context, ad control.Admin, args []string) error {
		var id int64
		if _, err := fmt.Sscan(args[0], &id); err != nil || id <= 0 {
			return fmt.Errorf("re-drive id %q: want a positive number (idem redrive list shows them)", args[0])
		}
		return fn(ctx, ad, id)
	})
}

func newRedriveShowCmd(a *app) *cobra.Command {
	k := &controls{a: a}
	c := &cobra.Command{
		Use:     "show ID",
		Short:   "Show one re-drive and its progress in each partition",
		Example: `  idem redrive show 7`,
		Args:    cobra.ExactArgs(1),
		RunE: k.onRedrive(func(ctx context.Context, ad control.Admin, id int64) error {
			rd, err := ad.Redrive(ctx, id)
			if err != nil {
				return err
			}
			if k.asJSON {
				return writeJSON(a.out, rd)
			}
			printRedrive(a, rd)
			return nil
		}),
	}
	c.Flags().BoolVar(&k.asJSON, "json", false, "print JSON")
	k.dbFlags(c)
	return c
}

func printRedrive(a *app, rd control.Redrive) {
	total, done := rd.Offsets()
	fmt.Fprintf(a.out, "re-drive %d: %s\n", rd.ID, rd.State)
	fmt.Fprintf(a.out, "  %s\n", rd.Detail())
	fmt.Fprintf(a.out, "  by %s at %s: %s\n", text(rd.By), fmtTime(rd.CreatedAt), text(rd.Reason))
	if !rd.FinishedAt.IsZero() {
		by := ""
		if rd.FinishedBy != "" {
			by = " by " + text(rd.FinishedBy)
		}
		fmt.Fprintf(a.out, "  ended %s%s\n", fmtTime(rd.FinishedAt), by)
	}
	fmt.Fprintf(a.out, "  %d of %d offsets re-driven\n", done, total)
	printParts(a, rd)
}

func newRedriveCancelCmd(a *app) *cobra.Command {
	k := &controls{a: a}
	c := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a running re-drive; what it handled stays done under its epoch",
		Long: `Cancel a running re-drive: its members stop reading its window at the next
record. What it handled stays handled under its epoch (a re-drive under
the same epoch does not run it again). Audited, with --reason, under the OS
user with --actor beside it.`,
		Example: `  idem redrive cancel 7 --reason "wrong window"`,
		Args:    cobra.ExactArgs(1),
		RunE: k.onRedrive(func(ctx context.Context, ad control.Admin, id int64) error {
			rd, err := ad.CancelRedrive(ctx, a.actorName(), id, k.reason)
			if err != nil {
				return err
			}
			total, done := rd.Offsets()
			fmt.Fprintf(a.out, "re-drive %d cancelled after %d of %d offsets\n", rd.ID, done, total)
			return nil
		}),
	}
	c.Flags().StringVar(&k.reason, "reason", "", "why (written to the audit log)")
	k.dbFlags(c)
	return c
}

func newFleetCmd(a *app) *cobra.Command {
	k := &controls{a: a}
	c := &cobra.Command{
		Use:   "fleet",
		Short: "The members of each consumer group, their partitions, lag, pauses and breakers, and the operator's pauses",
		Long: `List the members of each consumer group that run with
consumer.Config.Controls, from the heartbeat row each writes every 10 s: its
id (host/pid/random), instance id, host, idem version, the partitions it
claims with their lag and why each is paused, an open breaker, and its last
heartbeat. A member that missed 3 beats is marked stale (it died, or lost
its database). Then the operator's pauses.`,
		Example: `  idem fleet
  idem fleet --group billing --json`,
		Args: cobra.NoArgs,
		RunE: k.withAdmin(func(ctx context.Context, ad control.Admin, _ []string) error {
			ms, err := ad.Fleet(ctx, k.group)
			if err != nil {
				return err
			}
			ps, err := ad.Pauses(ctx, k.group)
			if err != nil {
				return err
			}
			if k.asJSON {
				return writeJSON(a.out, map[string]any{"members": ms, "pauses": ps, "stale_after_beats": control.StaleBeats})
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "GROUP\tMEMBER\tINSTANCE\tHOST\tVERSION\tPARTITIONS (LAG; PAUSED FOR)\tBREAKER\tLAST BEAT")
			for _, m := range ms {
				var parts []string
				for _, p := range m.Status.Partitions {
					s := fmt.Sprintf("%s/%d (%d", p.Topic, p.Partition, p.Lag)
					for _, why := range p.Paused {
						s += "; " + why
					}
					parts = append(parts, text(s+")"))
				}
				breaker := "-"
				if b := m.Status.Breaker; b != nil {
					breaker = text(b.Name) + " open until " + fmtTime(b.Until)
				}
				beat := fmtTime(m.BeatAt)
				if m.Stale {
					beat += fmt.Sprintf(" STALE (%d beats missed)", m.MissedBeats)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", text(m.Group), text(m.ID), dash(m.InstanceID), text(m.Host), text(m.Version),
					dash(strings.Join(parts, " ")), breaker, beat)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(ms) == 0 {
				fmt.Fprintln(a.out, "no member reports to the fleet (members report when they run with consumer.Config.Controls)")
			}
			fmt.Fprintln(a.out)
			if len(ps) == 0 {
				fmt.Fprintln(a.out, "no pauses")
				return nil
			}
			tw = tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "GROUP\tPAUSED\tBY\tSINCE\tREASON")
			for _, p := range ps {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", text(p.Group), text(p.What()), text(p.By), fmtTime(p.At), truncate(p.Reason, 60))
			}
			return tw.Flush()
		}),
	}
	c.Flags().StringVarP(&k.group, "group", "g", "", "only this consumer group")
	c.Flags().BoolVar(&k.asJSON, "json", false, "print JSON")
	k.dbFlags(c)
	return c
}

package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// newOrderingCmd builds `idem ordering list|release`.
func newOrderingCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "ordering <command>",
		Short: "Show and release messages parked by ByKey ordering",
		Long: `Show and release the messages ByKey ordering parked behind a key's head (the
message of that Kafka key waiting in a retry tier).

Parked messages are stored in PostgreSQL (idem_ordering_parked); their Kafka
offsets are already committed. They are stranded, with nothing left to read
them, when ordering is switched off, when a tier is removed from
Retry.Tiers.Delays, when the head's record expired from its tier by retention, or
when the topic is dropped from Config.Topics. Run warns about the first two
(and the last) at start. list shows them; release sends them on.`,
		Example: `  idem ordering list --group payments
  idem ordering release --group payments --topic orders --key order-42 --to source`,
	}
	c.AddCommand(newOrderingListCmd(a), newOrderingReleaseCmd(a))
	return c
}

// dbFlag adds --database-url, which DATABASE_URL sets when it is not given
// (the URL is not shown as a default in help: it may hold a password).
func dbFlag(c *cobra.Command, url *string) {
	c.Flags().StringVar(url, "database-url", "", "PostgreSQL URL")
	envFlag(c.Flags(), "database-url", "DATABASE_URL")
}

func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, errors.New("no database: set --database-url or DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	return pool, nil
}

// showKey prints a Kafka key as text when it is printable UTF-8, else as
// hex:… (what --key-hex takes).
func showKey(k []byte) string {
	if utf8.Valid(k) {
		printable := true
		for _, r := range string(k) {
			if !unicode.IsPrint(r) {
				printable = false
				break
			}
		}
		if printable && len(k) > 0 {
			return string(k)
		}
	}
	return "hex:" + hex.EncodeToString(k)
}

func age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String()
}

func newOrderingListCmd(a *app) *cobra.Command {
	var url, group, topic string
	var asJSON bool
	c := &cobra.Command{
		Use:   "list",
		Short: "List blocked keys and their parked messages per group and topic",
		Long: `List the keys ByKey ordering holds blocked: per consumer group and source topic,
each key with its head (the idempotency key it waits for), the head's retry
tier (0: not recorded), whether the head's forward to its tier is still
pending, how many messages are parked behind it and how old the oldest is;
then a total per group and topic. Keys that are not printable text are shown
as hex:… (give them to release with --key-hex). Reads only.`,
		Example: `  idem ordering list --database-url postgres://idem@db/idem
  idem ordering list --group payments --topic orders --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			pool, err := openPool(ctx, url)
			if err != nil {
				return err
			}
			defer pool.Close()
			keys, err := keyorder.List(ctx, pool, group, topic)
			if err != nil {
				return err
			}
			if asJSON {
				return listJSON(a, keys)
			}
			listText(a, keys)
			return nil
		},
	}
	dbFlag(c, &url)
	c.Flags().StringVarP(&group, "group", "g", "", "consumer group (default: every group)")
	c.Flags().StringVarP(&topic, "topic", "t", "", "source topic (default: every topic)")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	return c
}

type orderingTotal struct {
	Group  string `json:"group"`
	Topic  string `json:"topic"`
	Keys   int    `json:"keys"`
	Parked int    `json:"parked"`
	// Oldest is when the oldest message of the group and topic was parked.
	Oldest time.Time `json:"oldest_parked_at,omitzero"`
}

func totals(keys []keyorder.BlockedKey) []orderingTotal {
	var out []orderingTotal
	for _, k := range keys {
		if n := len(out); n == 0 || out[n-1].Group != k.Group || out[n-1].Topic != k.Topic {
			out = append(out, orderingTotal{Group: k.Group, Topic: k.Topic})
		}
		t := &out[len(out)-1]
		t.Keys++
		t.Parked += k.Parked
		if !k.OldestParked.IsZero() && (t.Oldest.IsZero() || k.OldestParked.Before(t.Oldest)) {
			t.Oldest = k.OldestParked
		}
	}
	return out
}

func listText(a *app, keys []keyorder.BlockedKey) {
	if len(keys) == 0 {
		fmt.Fprintln(a.out, "no blocked keys")
		return
	}
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tKEY\tHEAD\tTIER\tPENDING\tPARKED\tOLDEST AGE")
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%t\t%d\t%s\n", k.Group, k.Topic, truncate(showKey(k.Key), 40),
			orDash(truncate(k.Head, 40)), k.Tier, k.Pending, k.Parked, age(k.OldestParked))
	}
	_ = tw.Flush()
	for _, t := range totals(keys) {
		fmt.Fprintf(a.out, "group %s topic %s: %d blocked keys, %d parked messages, oldest parked %s ago\n",
			t.Group, t.Topic, t.Keys, t.Parked, age(t.Oldest))
	}
}

func listJSON(a *app, keys []keyorder.BlockedKey) error {
	type key struct {
		Group        string    `json:"group"`
		Topic        string    `json:"topic"`
		Key          *string   `json:"key"` // null when not UTF-8: see key_hex
		KeyHex       string    `json:"key_hex"`
		Head         string    `json:"head"`
		Tier         int       `json:"tier"`
		HeadSince    time.Time `json:"head_since,omitzero"`
		Pending      bool      `json:"pending"`
		Parked       int       `json:"parked"`
		OldestParked time.Time `json:"oldest_parked_at,omitzero"`
	}
	out := struct {
		Keys   []key           `json:"keys"`
		Totals []orderingTotal `json:"totals"`
	}{Keys: []key{}, Totals: totals(keys)}
	for _, k := range keys {
		j := key{Group: k.Group, Topic: k.Topic, KeyHex: hex.EncodeToString(k.Key), Head: k.Head, Tier: k.Tier,
			HeadSince: k.Since, Pending: k.Pending, Parked: k.Parked, OldestParked: k.OldestParked}
		if utf8.Valid(k.Key) {
			s := string(k.Key)
			j.Key = &s
		}
		out.Keys = append(out.Keys, j)
	}
	if out.Totals == nil {
		out.Totals = []orderingTotal{}
	}
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// releaseOpts are release's flags.
type releaseOpts struct {
	url, group, topic, key, keyHex, to string
	all, dryRun                        bool
}

// keys returns which keys to release: the one named, or every blocked key of
// the group and topic.
func (o releaseOpts) keys(ctx context.Context, db keyorder.DB) ([][]byte, error) {
	var want []byte
	switch {
	case o.keyHex != "":
		var err error
		if want, err = hex.DecodeString(o.keyHex); err != nil {
			return nil, fmt.Errorf("--key-hex %q: %v", o.keyHex, err)
		}
	case !o.all:
		want = []byte(o.key)
	}
	blocked, err := keyorder.List(ctx, db, o.group, o.topic)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for _, b := range blocked {
		if o.all || string(b.Key) == string(want) {
			out = append(out, b.Key)
		}
	}
	if len(out) == 0 && !o.all {
		return nil, fmt.Errorf("key %s is not blocked in group %s topic %s (see idem ordering list)", showKey(want), o.group, o.topic)
	}
	return out, nil
}

func newOrderingReleaseCmd(a *app) *cobra.Command {
	var o releaseOpts
	c := &cobra.Command{
		Use:   "release",
		Short: "Send a blocked key's parked messages on, in order, and unblock it",
		Long: `Release gives up the ordering of one key (--key K, or --key-hex for a key that is
not text) or of every blocked key of the topic (--all): it forwards, in order,
the head's pending forward if one was interrupted and then every parked
message of the key, to the destination --to names, then deletes the parked
rows and the head. Records keep their Kafka key, value, original headers
(idempotency-key included, so a message already handled is dropped as a
duplicate) and their partition number.

--to is required:
  source   the source topic (--topic). idem-* headers are removed: the group
           handles them as new messages.
  TOPIC    a topic by name, usually the source's first retry tier
           (<topic>.<group>.retry.1 unless Retry.Tiers.TierTopic renames it). The
           records carry idem-* headers marking them due now in tier 1 of
           --topic for --group, so the group's consumer handles them at once.
The destination must exist: idem never creates a topic, and an unknown one is
an error before anything is read or changed.

Use it when the head will not come back: ordering switched off, the head's
tier removed from Retry.Tiers.Delays, or its record expired from the tier. If the
head does come back later it is handled on its own, after the released
messages. Each key is released in one transaction holding its head: a
consumer parking or draining that key waits. If a send fails, that key's rows
stay (records already sent are sent again by the next release; their
idempotency keys make the copies duplicates).

Parked messages sealed at rest (consumer.Config.EncryptionKeyFile) need the
same key (--encryption-key-file or IDEM_ENCRYPTION_KEY). A message whose
data key was destroyed is never sent to --to: a stub of it (no value, none of
its headers, kind permanent, the reason as idem-error) goes to the
dead-letter topic instead, and the command says so.`,
		Example: `  idem ordering release --group payments --topic orders --key order-42 --to source
  idem ordering release --group payments --topic orders --all --to orders.payments.retry.1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n := 0
			for _, set := range []bool{o.key != "", o.keyHex != "", o.all} {
				if set {
					n++
				}
			}
			if n != 1 {
				return errors.New("give exactly one of --key, --key-hex or --all")
			}
			return releaseRun(cmd.Context(), a, o)
		},
	}
	dbFlag(c, &o.url)
	c.Flags().StringVarP(&o.group, "group", "g", "", "consumer group (required)")
	c.Flags().StringVarP(&o.topic, "topic", "t", "", "source topic (required)")
	c.Flags().StringVarP(&o.key, "key", "k", "", "the Kafka key to release")
	c.Flags().StringVar(&o.keyHex, "key-hex", "", "the Kafka key to release, hex-encoded (as list shows hex:…)")
	c.Flags().BoolVar(&o.all, "all", false, "release every blocked key of --topic")
	c.Flags().StringVar(&o.to, "to", "", `destination: "source", or a topic name such as the first retry tier (required)`)
	c.Flags().BoolVar(&o.dryRun, "dry-run", false, "check the destination and count what would be released; send and change nothing")
	encryptionFlag(c.Flags(), &a.keyFile)
	for _, f := range []string{"group", "topic", "to"} {
		_ = c.MarkFlagRequired(f)
	}
	a.kafkaFlags(c)
	return c
}

func releaseRun(ctx context.Context, a *app, o releaseOpts) error {
	dest := o.to
	if dest == "source" {
		dest = o.topic
	}
	cfg, brokers, err := a.saramaConfig()
	if err != nil {
		return err
	}
	retrytopic.ConfigureProducer(cfg)
	cfg.Metadata.AllowAutoTopicCreation = false // never create --to by sending to it
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return fmt.Errorf("connect to %v: %w", brokers, err)
	}
	defer client.Close()
	if err := client.RefreshMetadata(dest); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return fmt.Errorf("metadata of %s: %w", dest, err)
	}
	if ps, err := client.Partitions(dest); err != nil || len(ps) == 0 {
		return fmt.Errorf("--to %q: unknown topic %s (idem never creates it); nothing released", o.to, dest)
	}

	pool, err := openPool(ctx, o.url)
	if err != nil {
		return err
	}
	defer pool.Close()
	keys, err := o.keys(ctx, pool)
	if err != nil {
		return err
	}
	sl, err := a.sealer(ctx, pool, keyorder.Purpose)
	if err != nil {
		return fmt.Errorf("encryption at rest: %w", err)
	}
	s := keyorder.New(pool, o.group).Sealed(sl)
	if o.dryRun {
		blocked, err := keyorder.List(ctx, pool, o.group, o.topic)
		if err != nil {
			return err
		}
		n := 0
		for _, b := range blocked {
			for _, k := range keys {
				if string(k) == string(b.Key) {
					n += b.Parked
					if b.Pending {
						n++
					}
				}
			}
		}
		fmt.Fprintf(a.out, "dry run: would release %d messages of %d keys of group %s topic %s to %s; nothing sent or changed\n",
			n, len(keys), o.group, o.topic, dest)
		return nil
	}
	fwd, err := forward.NewForwarderFromClient(client)
	if err != nil {
		return err
	}
	defer fwd.Close()
	total := 0
	for i, k := range keys {
		n, err := s.Release(ctx, o.topic, k, func(r keyorder.Record) error {
			if r.Unreadable != nil { // sealed at rest, its key destroyed: never sent on
				stub := unreadableStub(r, o)
				if err := fwd.Forward(ctx, stub); err != nil {
					return err
				}
				fmt.Fprintf(a.out, "message %s of key %s cannot be read (%v): dead-lettered as a stub to %s, not sent to %s\n",
					r.IdempotencyKey, showKey(k), r.Unreadable, stub.Topic, dest)
				return nil
			}
			return fwd.Forward(ctx, releaseRecord(r, dest, o))
		})
		if err != nil {
			return fmt.Errorf("key %s: %w (released %d messages of %d keys before it)", showKey(k), err, total, i)
		}
		total += n
		fmt.Fprintf(a.out, "released key %s: %d messages to %s\n", showKey(k), n, dest)
	}
	fmt.Fprintf(a.out, "released %d messages of %d keys of group %s topic %s to %s\n", total, len(keys), o.group, o.topic, dest)
	return nil
}

// unreadableStub is the dead-letter stub release sends instead of r, whose
// payload, sealed at rest, cannot be opened for good: to its pending
// forward's dead-letter topic, or the default one of --topic and --group.
func unreadableStub(r keyorder.Record, o releaseOpts) forward.Record {
	dlq := r.DLQ
	if dlq == "" {
		dlq = retrytopic.Policy{}.DLQ(o.topic, o.group)
	}
	src := wire.Source{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp, Group: o.group}
	return forward.Record{Topic: dlq, Partition: r.Partition, Key: r.Key,
		Headers: wire.UnreadableStub(src, r.IdempotencyKey, fmt.Errorf("parked message's payload, sealed at rest, cannot be opened: %w", r.Unreadable), time.Now())}
}

// releaseRecord is the record release sends for r: key, value, partition and
// original headers as they were; to the source without idem-* headers, to
// another topic (a retry tier) with headers that make it due now in tier 1.
func releaseRecord(r keyorder.Record, dest string, o releaseOpts) forward.Record {
	orig := make([]sarama.RecordHeader, 0, len(r.Headers))
	for _, h := range r.Headers {
		orig = append(orig, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	hs := wire.StripHeaders(orig)
	if dest != o.topic {
		now := time.Now()
		prior, _, _ := wire.Decode(orig) // a promoted head carries its failure
		f := retrytopic.Failure{
			Attempt: max(prior.Attempt, 1), Tier: 1, DueAt: now,
			OriginalTopic: r.Topic, OriginalPartition: r.Partition, OriginalOffset: r.Offset, OriginalTimestamp: r.Timestamp,
			Group: o.group, Kind: handler.KindRetriable, Error: "released by idem ordering release",
			FirstFailureAt: now, LastFailureAt: now,
		}
		if !prior.FirstFailureAt.IsZero() {
			f.FirstFailureAt = prior.FirstFailureAt
		}
		hs = wire.Encode(hs, f)
	}
	return forward.Record{Topic: dest, Partition: r.Partition, Key: r.Key, Value: r.Value, Headers: hs}
}

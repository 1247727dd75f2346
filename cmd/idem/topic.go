package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/cobra"
)

func newTopicCmd(a *app) *cobra.Command {
	c := &cobra.Command{
		Use:   "topic <command>",
		Short: "Create and delete Kafka topics",
		Long: `Create and delete Kafka topics.

idem's brokers often do not create topics on first use (and idem's commands
never ask them to), so a new source topic is created here, or with
kafka-topics.sh; a trial's topics are deleted here too.`,
		Example: `  idem topic create payments --partitions 6
  idem topic create payments --partitions 6 --replication-factor 3 --config retention.ms=604800000 --if-not-exists
  idem topic delete payments.billing.retry.1 payments.billing.dlq`,
	}
	a.kafkaFlags(c)
	c.AddCommand(newTopicCreateCmd(a), newTopicDeleteCmd(a))
	return c
}

// topicCreate holds the flags of idem topic create.
type topicCreate struct {
	partitions  int32
	replication int16
	configs     []string
	ifNotExists bool
}

func newTopicCreateCmd(a *app) *cobra.Command {
	var o topicCreate
	c := &cobra.Command{
		Use:   "create NAME --partitions N",
		Short: "Create a topic",
		Long: `Create topic NAME with --partitions partitions, wait until every partition
has a leader (so idem produce can write to it at once), and print what was
created.

A topic that already exists is an error, unless --if-not-exists: then its
partition count is printed and nothing changes (its partitions and configs
are not compared with the flags).`,
		Example: `  idem topic create payments --partitions 6
  idem topic create payments --partitions 6 --replication-factor 3
  idem topic create payments.events -p 3 --config retention.ms=86400000 --config cleanup.policy=compact
  idem topic create payments -p 6 --if-not-exists`,
		Args: oneArg("give one topic name: idem topic create NAME --partitions N"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.createTopic(cmd.Context(), cmd, args[0], o)
		},
	}
	f := c.Flags()
	f.Int32VarP(&o.partitions, "partitions", "p", 0, "number of partitions (required, >= 1)")
	f.Int16Var(&o.replication, "replication-factor", -1, "replicas of each partition; -1: the broker's default.replication.factor")
	f.StringArrayVar(&o.configs, "config", nil, "topic config as key=value (repeatable), e.g. retention.ms=86400000")
	f.BoolVar(&o.ifNotExists, "if-not-exists", false, "succeed without changing anything when the topic already exists")
	return c
}

// parseKV parses "key=value" pairs given to flag (its name, for errors): the
// key is what precedes the first '=' and must not be empty.
func parseKV(flag string, pairs []string) ([][2]string, error) {
	out := make([][2]string, 0, len(pairs))
	for _, p := range pairs {
		k, v, ok := strings.Cut(p, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("--%s %q: want key=value", flag, p)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// createTopic creates name as o says and waits for its leaders.
func (a *app) createTopic(ctx context.Context, cmd *cobra.Command, name string, o topicCreate) error {
	switch {
	case strings.TrimSpace(name) == "":
		return errors.New("the topic name is empty")
	case !cmd.Flags().Changed("partitions"):
		return errors.New("--partitions is required: how many partitions the topic has (idem topic create NAME --partitions N)")
	case o.partitions < 1:
		return fmt.Errorf("--partitions %d: must be >= 1", o.partitions)
	case o.replication == 0 || o.replication < -1:
		return fmt.Errorf("--replication-factor %d: must be >= 1, or -1 for the broker's default", o.replication)
	}
	kvs, err := parseKV("config", o.configs)
	if err != nil {
		return err
	}
	entries := map[string]*string{}
	for _, kv := range kvs {
		v := kv[1]
		entries[kv[0]] = &v
	}
	cfg, brokers, err := a.saramaConfig()
	if err != nil {
		return err
	}
	cfg.Metadata.Full = true // the admin client refreshes metadata without naming topics
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", strings.Join(brokers, ","), err)
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	// admin.Close would close client too; the deferred client.Close does.
	err = admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: o.partitions, ReplicationFactor: o.replication,
		ConfigEntries: entries}, false)
	switch {
	case errors.Is(err, sarama.ErrTopicAlreadyExists) && o.ifNotExists:
		if err := client.RefreshMetadata(name); err != nil {
			return fmt.Errorf("topic %s exists, but its metadata cannot be read: %w", name, err)
		}
		ps, err := client.Partitions(name)
		if err != nil {
			return fmt.Errorf("topic %s exists, but its partitions cannot be read: %w", name, err)
		}
		fmt.Fprintf(a.out, "topic %s already exists (%d partitions); nothing changed\n", name, len(ps))
		return nil
	case errors.Is(err, sarama.ErrTopicAlreadyExists):
		return fmt.Errorf("topic %s already exists; nothing changed (give --if-not-exists to accept an existing topic)", name)
	case err != nil:
		return fmt.Errorf("create topic %s: %w", name, err)
	}
	if err := waitLeaders(ctx, client, name, o.partitions, 30*time.Second); err != nil {
		return fmt.Errorf("topic %s was created, but %w", name, err)
	}
	rf := "the broker's default replication factor"
	if o.replication > 0 {
		rf = fmt.Sprintf("replication factor %d", o.replication)
	}
	fmt.Fprintf(a.out, "created topic %s: %d partitions, %s", name, o.partitions, rf)
	if len(kvs) > 0 {
		var cs []string
		for _, kv := range kvs {
			cs = append(cs, kv[0]+"="+kv[1])
		}
		fmt.Fprintf(a.out, ", config %s", strings.Join(cs, ","))
	}
	fmt.Fprintln(a.out)
	return nil
}

// waitLeaders polls metadata until topic has n partitions, each with a
// leader, or until timeout or ctx ends.
func waitLeaders(ctx context.Context, client sarama.Client, topic string, n int32, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		err := func() error {
			if err := client.RefreshMetadata(topic); err != nil {
				return err
			}
			ps, err := client.Partitions(topic)
			if err != nil {
				return err
			}
			if int32(len(ps)) < n {
				return fmt.Errorf("%d of %d partitions are known", len(ps), n)
			}
			for _, p := range ps {
				if _, err := client.Leader(topic, p); err != nil {
					return fmt.Errorf("partition %d: %w", p, err)
				}
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its partitions have no leaders after %s: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("its partitions have no leaders yet: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// oneArg accepts exactly one argument; otherwise its error is want, with the
// count given.
func oneArg(want string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%s (got %d arguments)", want, len(args))
		}
		return nil
	}
}

func newTopicDeleteCmd(a *app) *cobra.Command {
	var yes bool
	c := &cobra.Command{
		Use:   "delete NAME...",
		Short: "Delete topics, after saying what they hold (asks unless --yes)",
		Long: `Delete exactly the topics named: no pattern, no prefix, nothing else. Each
must exist, and none may be one of Kafka's internal topics (names starting
with "__"); otherwise nothing is deleted. The command first prints each
topic's partitions and the records it holds, then asks for confirmation
unless --yes. Deleting a topic deletes its records for good.`,
		Example: `  idem topic delete payments.billing.dlq
  idem topic delete payments.billing.retry.1 payments.billing.retry.2 --yes`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.deleteTopics(args, yes)
		},
	}
	c.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	return c
}

// deleteTopics deletes names, after checking and showing each and asking
// unless yes.
func (a *app) deleteTopics(names []string, yes bool) error {
	if len(names) == 0 {
		return errors.New("name the topics to delete: idem topic delete NAME [NAME]")
	}
	for _, n := range names {
		if strings.HasPrefix(n, "__") {
			return fmt.Errorf("%s is one of Kafka's internal topics: idem never deletes one; nothing deleted", n)
		}
	}
	cfg, brokers, err := a.saramaConfig()
	if err != nil {
		return err
	}
	client, err := sarama.NewClient(brokers, cfg)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", strings.Join(brokers, ","), err)
	}
	defer client.Close()
	type found struct {
		name       string
		partitions int
		records    int64
	}
	var topics []found
	for _, n := range names {
		if err := client.RefreshMetadata(n); err != nil {
			return fmt.Errorf("topic %s: %w; nothing deleted", n, err)
		}
		ps, err := client.Partitions(n)
		if err != nil {
			return fmt.Errorf("topic %s: %w; nothing deleted", n, err)
		}
		f := found{name: n, partitions: len(ps)}
		for _, p := range ps {
			oldest, err1 := client.GetOffset(n, p, sarama.OffsetOldest)
			newest, err2 := client.GetOffset(n, p, sarama.OffsetNewest)
			if err := errors.Join(err1, err2); err != nil {
				return fmt.Errorf("topic %s: %w; nothing deleted", n, err)
			}
			f.records += newest - oldest
		}
		topics = append(topics, f)
	}
	for _, f := range topics {
		fmt.Fprintf(a.out, "%s: %d partitions, %d offsets held (records and transaction markers)\n", f.name, f.partitions, f.records)
	}
	if !yes {
		fmt.Fprintf(a.out, "delete %s and every record in it? [y/N] ", plural(int64(len(topics)), "topic"))
		line, _ := bufio.NewReader(a.in).ReadString('\n')
		if ans := strings.ToLower(strings.TrimSpace(line)); ans != "y" && ans != "yes" {
			fmt.Fprintln(a.out)
			return errors.New("delete not confirmed; nothing deleted")
		}
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	// admin.Close would close client too; the deferred client.Close does.
	for _, f := range topics {
		if err := admin.DeleteTopic(f.name); err != nil {
			return fmt.Errorf("delete topic %s: %w", f.name, err)
		}
		// The broker deletes a topic in the background: say "deleted" once
		// its metadata no longer lists it, so that a create or a list right
		// after sees it gone; a topic still listed after topicDeleteWait is
		// said to be still in deletion.
		if gone := waitTopicGone(admin, f.name, topicDeleteWait); !gone {
			fmt.Fprintf(a.out, "deletion of topic %s requested; the broker still lists it after %s (it finishes in the background)\n", f.name, topicDeleteWait)
			continue
		}
		fmt.Fprintf(a.out, "deleted topic %s\n", f.name)
	}
	return nil
}

// topicDeleteWait bounds how long idem topic delete waits for a deleted
// topic to leave the broker's metadata.
const topicDeleteWait = 30 * time.Second

// waitTopicGone polls the broker's topic list until name is absent, for at
// most wait; it reports whether it is gone. A failing list is tried again.
func waitTopicGone(admin sarama.ClusterAdmin, name string, wait time.Duration) bool {
	deadline := time.Now().Add(wait)
	for {
		if topics, err := admin.ListTopics(); err == nil {
			if _, ok := topics[name]; !ok {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond) // a poll's period
	}
}

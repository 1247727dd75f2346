package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/retrytopic"
)

// Replication of the run's topics on three nodes: every record is on all
// three, and an acks=all write needs two of them, so one node may be down.
const (
	clusterRF     = 3
	clusterMinISR = "2"
)

// retryPolicy is the members' retry policy (-retry-delays retryDelays): the
// harness names their tiers and DLQ with it.
func retryPolicy() retrytopic.Policy {
	var p retrytopic.Policy
	for _, s := range strings.Split(retryDelays, ",") {
		d, err := time.ParseDuration(s)
		if err != nil {
			panic(fmt.Sprintf("retryDelays %q: %v", retryDelays, err))
		}
		p.Delays = append(p.Delays, d)
	}
	return p.WithDefaults()
}

// createClusterTopics creates, on three nodes, the source and events topics
// and idem's tiers and DLQ of group with replication factor 3 and
// min.insync.replicas=2, before any member starts. idem's EnsureTopicsFor
// leaves existing topics alone (it only checks their partition count,
// max.message.bytes and retention), so the members find them made; the
// tiers and DLQ get what EnsureTopicsFor would give them: the source's
// max.message.bytes plus forward.HeaderHeadroom, and the policy's
// retention.
func createClusterTopics(brokers []string, source, events, group string) error {
	isr := map[string]*string{"min.insync.replicas": new(clusterMinISR)}
	for _, t := range []string{source, events} {
		if err := createTopic(brokers, t, clusterRF, isr); err != nil {
			return err
		}
	}
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	// Creation is asynchronous: a node may not know the topic yet.
	var srcMax int64
	for deadline := time.Now().Add(30 * time.Second); ; {
		if srcMax, err = topicConfigInt(admin, source, "max.message.bytes"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond) // polling interval
	}
	p := retryPolicy()
	cfg := map[string]*string{
		"min.insync.replicas": new(clusterMinISR),
		"max.message.bytes":   new(strconv.FormatInt(srcMax+forward.HeaderHeadroom, 10)),
		"retention.ms":        new(strconv.FormatInt(p.Retention.Milliseconds(), 10)),
	}
	for _, t := range p.Topics(source, group) {
		if err := createTopic(brokers, t, clusterRF, cfg); err != nil {
			return err
		}
	}
	return nil
}

// topicConfigInt is topic's config name, as an integer.
func topicConfigInt(admin sarama.ClusterAdmin, topic, name string) (int64, error) {
	results, err := admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{name}}}, sarama.DescribeConfigsOptions{})
	if err == nil && len(results) == 1 && results[0].ErrorCode != sarama.ErrNoError {
		err = results[0].ErrorCode
	}
	if err != nil {
		return 0, fmt.Errorf("describe config of %s: %w", topic, err)
	}
	for _, e := range results[0].Configs {
		if e.Name == name {
			return strconv.ParseInt(e.Value, 10, 64)
		}
	}
	return 0, fmt.Errorf("topic %s has no %s", topic, name)
}

// locate asks the cluster (from fresh metadata) which node serves one thing:
// a partition's leader, a group's or a transactional id's coordinator.
type locate func(c sarama.Client) (int32, error)

// leaderOf locates the leader of topic/partition, from the metadata a new
// client fetched from its seed brokers (Metadata.Full: every topic).
func leaderOf(topic string, partition int32) locate {
	return func(c sarama.Client) (int32, error) {
		b, err := c.Leader(topic, partition)
		if err != nil {
			return -1, err
		}
		return b.ID(), nil
	}
}

// groupCoordinator locates group's coordinator (FindCoordinator type=group).
func groupCoordinator(group string) locate {
	return func(c sarama.Client) (int32, error) {
		if err := c.RefreshCoordinator(group); err != nil {
			return -1, err
		}
		b, err := c.Coordinator(group)
		if err != nil {
			return -1, err
		}
		return b.ID(), nil
	}
}

// txnCoordinator locates the transaction coordinator of transactional id
// (FindCoordinator type=transaction; the broker creates __transaction_state,
// RF 3 and min.isr 2 on the cluster, at the first such request).
func txnCoordinator(id string) locate {
	return func(c sarama.Client) (int32, error) {
		if err := c.RefreshTransactionCoordinator(id); err != nil {
			return -1, err
		}
		b, err := c.TransactionCoordinator(id)
		if err != nil {
			return -1, err
		}
		return b.ID(), nil
	}
}

// find runs l until it answers, for up to timeout; with not > 0, until it
// names a node other than not (the answer after a failover).
func find(ctx context.Context, brokers []string, l locate, not int32, timeout time.Duration) (int32, error) {
	cfg := saramaConfig()
	cfg.Net.DialTimeout = 2 * time.Second
	cfg.Net.ReadTimeout = 5 * time.Second // a frozen node must not hold the answer up
	cfg.Metadata.Retry.Max = 0
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		id, err := func() (int32, error) {
			c, err := sarama.NewClient(brokers, cfg)
			if err != nil {
				return -1, err
			}
			defer c.Close()
			return l(c)
		}()
		switch {
		case err != nil:
			last = err
		case id == not:
			last = fmt.Errorf("still node %d", id)
		default:
			return id, nil
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return -1, err
		}
	}
	return -1, fmt.Errorf("no answer within %s: %w", timeout, last)
}

// clusterFaults are the three-node run's broker faults.
type clusterFaults struct {
	svc    *Services
	rnd    *rand.Rand
	source string
	group  string
	// txnID names the transactional.id whose coordinator txn-coordinator-kill
	// kills, and whose it is (a member, or why none).
	txnID   func(ctx context.Context) (id, whose string, err error)
	freeze  time.Duration
	logf    func(format string, args ...any) // the mode's log
	timeout time.Duration                    // how long a failover may take
	found   string                           // what the last fault found, for its report line
}

// killFound SIGKILLs the node that l names, waits until l names another node
// (the failover, logged with its duration), then starts the node again and
// waits until all three answer.
func (c *clusterFaults) killFound(ctx context.Context, what string, l locate) error {
	brokers := c.svc.Brokers()
	node, err := find(ctx, brokers, l, -1, c.timeout)
	if err != nil {
		return fmt.Errorf("find %s: %w", what, err)
	}
	c.logf("  %s is node %d: SIGKILL", what, node)
	c.found = fmt.Sprintf("%s was node %d", what, node)
	t0 := time.Now()
	if err := c.svc.KillNode(ctx, int(node)); err != nil {
		return err
	}
	next, err := find(ctx, brokers, l, node, c.timeout)
	if err != nil {
		return fmt.Errorf("%s after node %d's kill: %w", what, node, err)
	}
	moved := time.Since(t0).Round(100 * time.Millisecond)
	c.logf("  %s moved to node %d %s after the kill; restarting node %d", what, next, moved, node)
	c.found += fmt.Sprintf(", moved to node %d %s after the kill", next, moved)
	t1 := time.Now()
	if err := c.svc.StartKafka(ctx); err != nil {
		return err
	}
	back := time.Since(t1).Round(100 * time.Millisecond)
	c.logf("  node %d back, all three nodes answer (%s)", node, back)
	c.found += fmt.Sprintf("; node %d back %s later", node, back)
	return nil
}

// sourceLeader kills the leader of a random source partition.
func (c *clusterFaults) sourceLeader(ctx context.Context) error {
	p := c.rnd.Int32N(partitions)
	return c.killFound(ctx, fmt.Sprintf("the leader of %s/%d", c.source, p), leaderOf(c.source, p))
}

// tierLeader kills the leader of a random partition of a random tier or the
// DLQ.
func (c *clusterFaults) tierLeader(ctx context.Context) error {
	ts := retryPolicy().Topics(c.source, c.group)
	t, p := ts[c.rnd.IntN(len(ts))], c.rnd.Int32N(partitions)
	return c.killFound(ctx, fmt.Sprintf("the leader of %s/%d", t, p), leaderOf(t, p))
}

// groupCoordinator kills the group's coordinator.
func (c *clusterFaults) groupCoordinator(ctx context.Context) error {
	return c.killFound(ctx, "the coordinator of group "+c.group, groupCoordinator(c.group))
}

// txnCoordinator kills the transaction coordinator of the transactional.id
// c.txnID names (a live member's, with -transactions).
func (c *clusterFaults) txnCoordinator(ctx context.Context) error {
	id, whose, err := c.txnID(ctx)
	if err != nil {
		return fmt.Errorf("transactional id: %w", err)
	}
	return c.killFound(ctx, "the transaction coordinator of "+id+" ("+whose+")", txnCoordinator(id))
}

// freezeLeader SIGSTOPs the leader of a random source partition for
// c.freeze (past the session timeouts: the controller fences it and its
// leaderships move), then SIGCONTs it and waits until all three answer.
func (c *clusterFaults) freezeLeader(ctx context.Context) error {
	p := c.rnd.Int32N(partitions)
	what := fmt.Sprintf("the leader of %s/%d", c.source, p)
	node, err := find(ctx, c.svc.Brokers(), leaderOf(c.source, p), -1, c.timeout)
	if err != nil {
		return fmt.Errorf("find %s: %w", what, err)
	}
	c.logf("  %s is node %d: SIGSTOP for %s", what, node, c.freeze)
	if err := c.svc.SignalNode(int(node), syscall.SIGSTOP); err != nil {
		return err
	}
	t0 := time.Now()
	// Ask the other two: a frozen node accepts connections but never answers.
	others := slices.DeleteFunc(c.svc.Brokers(), func(a string) bool { return a == c.svc.addr(int(node)) })
	if next, err := find(ctx, others, leaderOf(c.source, p), node, c.freeze); err == nil {
		c.logf("  %s moved to node %d %s into the freeze", what, next, time.Since(t0).Round(100*time.Millisecond))
	} else {
		c.logf("  %s did not move during the freeze: %v", what, err)
	}
	serr := sleep(ctx, time.Until(t0.Add(c.freeze)))
	if err := errors.Join(serr, c.svc.SignalNode(int(node), syscall.SIGCONT)); err != nil {
		return err
	}
	t1 := time.Now()
	if err := c.svc.StartKafka(ctx); err != nil {
		return err
	}
	c.logf("  node %d resumed; all three nodes answer (%s)", node, time.Since(t1).Round(100*time.Millisecond))
	return nil
}

// rollingRestart stops each node in turn with SIGTERM (a controlled
// shutdown), starts it again and waits until all three answer before the
// next.
func (c *clusterFaults) rollingRestart(ctx context.Context) error {
	for n := 1; n <= 3; n++ {
		t0 := time.Now()
		if err := c.svc.StopNode(ctx, n, 60*time.Second); err != nil {
			return err
		}
		stopped := time.Since(t0)
		if err := c.svc.StartKafka(ctx); err != nil {
			return err
		}
		c.logf("  node %d stopped in %s, back with all three answering after %s", n, stopped.Round(100*time.Millisecond), time.Since(t0).Round(100*time.Millisecond))
	}
	return nil
}

package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// The cluster faults' locators on a real three-node cluster: a partition's
// leader, the group and transaction coordinators each name a node, the
// harness's topics have three replicas and min.insync.replicas=2, and after
// the leader's SIGKILL the locator names another node; StartKafka brings the
// killed node back. forward.EnsureTopicsFor, called right after the kill
// on an admin whose controller is the killed node, succeeds (it asks another
// node instead of failing with "connection refused").
func TestClusterLocatorsFollowAFailover(t *testing.T) {
	testenv.SkipIfShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	_, file, _, _ := runtime.Caller(0)
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, "kafka"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(testenv.KafkaLibs(t), filepath.Join(state, "kafka", "libs")); err != nil {
		t.Fatal(err)
	}
	base := testenv.FreePortRange(t, 6)
	svc := &Services{Root: filepath.Join(filepath.Dir(file), "..", "..", ".."), State: state, KafkaPort: base, ControllerPort: base + 1, Nodes: 3, Log: t.Logf}
	t.Cleanup(func() {
		if err := svc.script(context.Background(), "down"); err != nil {
			t.Error(err)
		}
	})
	if err := svc.StartKafka(ctx); err != nil {
		t.Fatal(err)
	}
	brokers := svc.Brokers()
	if len(brokers) != 3 {
		t.Fatalf("brokers %v", brokers)
	}
	source, group := "payments-t", "chaos-t"
	if err := createClusterTopics(brokers, source, source+".events", group); err != nil {
		t.Fatal(err)
	}
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	topics := append([]string{source, source + ".events"}, retryPolicy().Topics(source, group)...)
	// Creation is asynchronous: poll until every topic has its partitions.
	testenv.Eventually(t, time.Minute, func() error {
		ds, err := admin.DescribeTopics(topics)
		if err != nil {
			return err
		}
		for _, d := range ds {
			if d.Err != sarama.ErrNoError || len(d.Partitions) != partitions {
				return fmt.Errorf("topic %s: %v, %d partitions; want %d", d.Name, d.Err, len(d.Partitions), partitions)
			}
			for _, p := range d.Partitions {
				if len(p.Replicas) != clusterRF {
					return fmt.Errorf("topic %s/%d: replicas %v; want %d", d.Name, p.ID, p.Replicas, clusterRF)
				}
			}
		}
		for _, tp := range topics {
			if isr, err := topicConfigInt(admin, tp, "min.insync.replicas"); err != nil || isr != 2 {
				return fmt.Errorf("topic %s: min.insync.replicas %d, %v", tp, isr, err)
			}
		}
		return nil
	})
	nodes := []int32{1, 2, 3}
	for what, l := range map[string]locate{"group coordinator": groupCoordinator(group), "transaction coordinator": txnCoordinator(group + "-txn")} {
		n, err := find(ctx, brokers, l, -1, time.Minute)
		if err != nil || !slices.Contains(nodes, n) {
			t.Fatalf("%s: node %d, %v", what, n, err)
		}
	}
	// idem's start-time topic check on a client that takes the node about to
	// be killed for the controller (sarama's DescribeTopics asks only it):
	// the node is the leader of a source partition, so the locator check
	// below follows the same kill.
	client, leader, p := controllerLeading(t, brokers, source)
	l := leaderOf(source, p)
	if err := svc.KillNode(ctx, int(leader)); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	a, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatal(err)
	}
	ectx, ecancel := context.WithTimeout(ctx, 45*time.Second)
	_, err = forward.EnsureTopicsFor(ectx, a, source, group, retryPolicy())
	ecancel()
	if err != nil {
		t.Fatalf("forward.EnsureTopicsFor right after the SIGKILL of node %d, its admin's controller: %v (after %s)", leader, err, time.Since(t0).Round(100*time.Millisecond))
	}
	t.Logf("forward.EnsureTopicsFor right after the SIGKILL of node %d, its admin's controller, succeeded in %s", leader, time.Since(t0).Round(100*time.Millisecond))
	next, err := find(ctx, brokers, l, leader, time.Minute)
	if err != nil || next == leader || !slices.Contains(nodes, next) {
		t.Fatalf("after node %d's kill the leader is node %d, %v", leader, next, err)
	}
	t.Logf("leader of %s/%d moved from node %d to node %d in %s", source, p, leader, next, time.Since(t0).Round(100*time.Millisecond))
	if err := svc.StartKafka(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.NodePID(int(leader)); err != nil {
		t.Fatalf("node %d not restarted: %v", leader, err)
	}
}

// controllerLeading returns a client (closed at cleanup) whose controller is
// the leader of a partition of topic, that node and that partition. Each new
// client reads the controller from the metadata of a random node, which
// names a random live node in KRaft mode.
func controllerLeading(t *testing.T, brokers []string, topic string) (sarama.Client, int32, int32) {
	t.Helper()
	for range 50 {
		c, err := sarama.NewClient(brokers, saramaConfig())
		if err != nil {
			t.Fatal(err)
		}
		ctrl, err := c.Controller()
		if err != nil {
			t.Fatal(err)
		}
		for p := range int32(partitions) {
			if b, err := c.Leader(topic, p); err == nil && b.ID() == ctrl.ID() {
				t.Cleanup(func() { c.Close() })
				return c, ctrl.ID(), p
			}
		}
		c.Close()
	}
	t.Fatalf("no client whose controller leads a partition of %s in 50 tries", topic)
	return nil, 0, 0
}

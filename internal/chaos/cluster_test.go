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

	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// The cluster faults' locators on a real three-node cluster: a partition's
// leader, the group and transaction coordinators each name a node, the
// harness's topics have three replicas and min.insync.replicas=2, and after
// the leader's SIGKILL the locator names another node; StartKafka brings the
// killed node back.
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
	svc := &Services{Root: filepath.Join(filepath.Dir(file), "..", ".."), State: state, KafkaPort: base, ControllerPort: base + 1, Nodes: 3, Log: t.Logf}
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
	l := leaderOf(source, 0)
	leader, err := find(ctx, brokers, l, -1, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.KillNode(ctx, int(leader)); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	// idem's start-time topic check while the dead node is not fenced yet
	// (measured and logged, not asserted: see docs/guarantees-cluster.md,
	// "Known gap").
	tries, failed, last := 0, 0, error(nil)
	for time.Since(t0) < 4*time.Second {
		tries++
		if a, err := sarama.NewClusterAdmin(brokers, saramaConfig()); err != nil {
			failed, last = failed+1, err
		} else {
			if _, err := retrytopic.EnsureTopicsFor(ctx, a, source, group, retryPolicy()); err != nil {
				failed, last = failed+1, err
			}
			a.Close()
		}
		time.Sleep(100 * time.Millisecond) // pacing, not synchronisation
	}
	t.Logf("retrytopic.EnsureTopicsFor in the 4 s after node %d's SIGKILL: %d of %d calls failed (last: %v)", leader, failed, tries, last)
	next, err := find(ctx, brokers, l, leader, time.Minute)
	if err != nil || next == leader || !slices.Contains(nodes, next) {
		t.Fatalf("after node %d's kill the leader is node %d, %v", leader, next, err)
	}
	t.Logf("leader of %s/0 moved from node %d to node %d in %s", source, leader, next, time.Since(t0).Round(100*time.Millisecond))
	if err := svc.StartKafka(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.NodePID(int(leader)); err != nil {
		t.Fatalf("node %d not restarted: %v", leader, err)
	}
}

package testkit

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
)

// Cluster is a Kafka cluster as a test kit sees it: bootstrap addresses,
// and the client settings every admin and client it opens uses.
type Cluster struct {
	Brokers []string
	// Config returns a new client config (version, security settings).
	Config func() *sarama.Config
}

// Admin returns a cluster admin on brokers with cfg, closed when the test
// ends.
func Admin(tb testing.TB, brokers []string, cfg *sarama.Config) sarama.ClusterAdmin {
	tb.Helper()
	a, err := sarama.NewClusterAdmin(brokers, cfg)
	if err != nil {
		tb.Fatalf("kafka admin: %v", err)
	}
	tb.Cleanup(func() { _ = a.Close() })
	return a
}

// Topic creates a topic named Unique(prefix) with partitions partitions,
// waits until it serves, and returns the name. When the test ends the topic
// is deleted, with every topic named after it and a dot (the retry tiers
// and the dead-letter topic consumer.Run made for it).
func (c Cluster) Topic(tb testing.TB, prefix string, partitions int32) string {
	tb.Helper()
	name := Unique(prefix)
	c.CreateTopic(tb, name, partitions, false)
	tb.Cleanup(func() { c.DeleteTopicTree(tb, name) })
	return name
}

// CreateTopic creates topic name (replication factor 1) and waits until it
// serves (WaitTopic). An existing topic of that name fails the test unless
// existsOK.
func (c Cluster) CreateTopic(tb testing.TB, name string, partitions int32, existsOK bool) {
	tb.Helper()
	admin, err := sarama.NewClusterAdmin(c.Brokers, c.Config())
	if err != nil {
		tb.Fatalf("idemtest: admin: %v", err)
	}
	defer admin.Close()
	err = admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
	if err != nil && !(existsOK && errors.Is(err, sarama.ErrTopicAlreadyExists)) {
		tb.Fatalf("idemtest: create topic %s: %v", name, err)
	}
	c.WaitTopic(tb, name, partitions)
}

// WaitTopic waits until topic shows partitions partitions, each with a
// leader that answers for it. Metadata names a leader before that broker has
// made the partition's log, and meanwhile a fetch or a produce is refused
// with NOT_LEADER_OR_FOLLOWER, which failed tests that used a topic right
// after creating it.
func (c Cluster) WaitTopic(tb testing.TB, topic string, partitions int32) {
	tb.Helper()
	client, err := sarama.NewClient(c.Brokers, c.Config())
	if err != nil {
		tb.Fatalf("idemtest: client: %v", err)
	}
	defer client.Close()
	Eventually(tb, 30*time.Second, func() error {
		if err := client.RefreshMetadata(topic); err != nil {
			return err
		}
		ps, err := client.Partitions(topic)
		if err != nil {
			return err
		}
		if int32(len(ps)) < partitions {
			return fmt.Errorf("topic %s has %d of %d partitions", topic, len(ps), partitions)
		}
		for _, p := range ps {
			if _, err := client.Leader(topic, p); err != nil {
				return err
			}
			if _, err := client.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
				return fmt.Errorf("topic %s partition %d: %w", topic, p, err)
			}
		}
		return nil
	})
}

// ProducerConfig sets c up for the test kit's producers: idempotent (with
// RequiredAcks = WaitForAll, which the callers' configs set), so a retried
// batch is written once and a test can count what it produced; and sarama's
// own retries of a refused batch (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE,
// each retried after a metadata refresh) last about 6 s instead of sarama's
// 3 tries 100 ms apart. A produce to a topic WaitTopic had just seen serve
// was refused with NotLeaderForPartition past those 3 tries on a machine at
// load 30 (consumer's TestReplayIsIdempotent). The retries are the
// producer's own, with the batch's sequence numbers kept, so none writes a
// record twice.
func ProducerConfig(c *sarama.Config) {
	c.Producer.Idempotent = true
	c.Net.MaxOpenRequests = 1 // sarama requires it with Idempotent
	c.Producer.Retry.Max = 30
	c.Producer.Retry.Backoff = 200 * time.Millisecond
}

// DeleteTopicTree deletes topic and every topic named topic + "." +
// anything, logging failures (a clean-up never fails the test).
func (c Cluster) DeleteTopicTree(tb testing.TB, topic string) {
	admin, err := sarama.NewClusterAdmin(c.Brokers, c.Config())
	if err != nil {
		tb.Logf("idemtest: delete topic %s: %v", topic, err)
		return
	}
	defer admin.Close()
	all, err := admin.ListTopics()
	if err != nil {
		tb.Logf("idemtest: delete topic %s: list topics: %v", topic, err)
		return
	}
	for name := range all {
		if name != topic && !strings.HasPrefix(name, topic+".") {
			continue
		}
		if err := admin.DeleteTopic(name); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			tb.Logf("idemtest: delete topic %s: %v", name, err)
		}
	}
}

// Group returns Unique(prefix) as a consumer group name, and deletes the
// group from the broker when the test ends (after the consumers the test
// started have stopped, as clean-ups run last-in first-out), logging
// failures.
func (c Cluster) Group(tb testing.TB, prefix string) string {
	tb.Helper()
	name := Unique(prefix)
	tb.Cleanup(func() {
		admin, err := sarama.NewClusterAdmin(c.Brokers, c.Config())
		if err != nil {
			tb.Logf("idemtest: delete group %s: %v", name, err)
			return
		}
		defer admin.Close()
		if err := admin.DeleteConsumerGroup(name); err != nil && !errors.Is(err, sarama.ErrGroupIDNotFound) {
			tb.Logf("idemtest: delete group %s: %v", name, err)
		}
	})
	return name
}

// Connect returns the Kafka a test runs against, chosen by the environment,
// and whether it is a real broker: KAFKA_BROKERS (comma-separated host:port)
// when set; else a failure when IDEM_REQUIRE_REAL_KAFKA=1; else an
// in-process cluster: with shared, the one SharedInProcess gives every test
// of the binary (internal/testing/testenv's, whose tests may call it more than once
// for one cluster), else a new one for tb (InProcess, idemtest's). It is the
// one place that makes this choice, for idemtest.Connect and
// internal/testing/testenv alike.
func Connect(tb testing.TB, shared bool) (brokers []string, real bool) {
	tb.Helper()
	for _, b := range strings.Split(os.Getenv("KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) > 0 {
		return brokers, true
	}
	if os.Getenv("IDEM_REQUIRE_REAL_KAFKA") == "1" {
		tb.Fatalf("idemtest: IDEM_REQUIRE_REAL_KAFKA=1 but KAFKA_BROKERS is not set: start a broker (make services) and export KAFKA_BROKERS (set -a; . .state/services.env; set +a)")
	}
	if shared {
		return SharedInProcess(tb), false
	}
	return InProcess(tb), false
}

// InProcess starts an in-process cluster of one broker (franz-go's kfake)
// for tb, shut down when tb ends, and returns its addresses.
func InProcess(tb testing.TB) []string {
	tb.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		tb.Fatalf("idemtest: start in-process kafka: %v", err)
	}
	tb.Cleanup(c.Close)
	return c.ListenAddrs()
}

var (
	sharedOnce    sync.Once
	sharedBrokers []string
	sharedErr     error
)

// SharedInProcess returns the addresses of one in-process cluster started on
// first use and kept until the process exits.
func SharedInProcess(tb testing.TB) []string {
	tb.Helper()
	sharedOnce.Do(func() {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			sharedErr = fmt.Errorf("idemtest: start in-process kafka: %w", err)
			return
		}
		sharedBrokers = c.ListenAddrs()
	})
	if sharedErr != nil {
		tb.Fatal(sharedErr)
	}
	return sharedBrokers
}

package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	"github.com/twmb/franz-go/pkg/kfake"
)

// KafkaVersion is the protocol version tests give sarama. Kafka 4 rejects the
// old protocol versions sarama's default (2.8) would pick.
var KafkaVersion = sarama.V4_0_0_0

// Kafka is the broker the tests run against.
type Kafka struct {
	// Brokers are the bootstrap addresses.
	Brokers []string
	// Kind says which broker runs: "env" (KAFKA_BROKERS), "testcontainers",
	// "kfake" or "secure" (NewSecureKafka).
	Kind string
	// configure, when set, adds the broker's security settings to Config.
	configure func(*sarama.Config)
}

var (
	kafkaOnce sync.Once
	kafkaEnv  *Kafka
	kafkaErr  error
)

// NewKafka returns the process-wide test broker, starting it on first use, and
// logs which broker runs.
func NewKafka(tb testing.TB) *Kafka {
	tb.Helper()
	SkipIfShort(tb)
	kafkaOnce.Do(func() {
		if b := os.Getenv("KAFKA_BROKERS"); b != "" {
			kafkaEnv = &Kafka{Brokers: strings.Split(b, ","), Kind: "env"}
			return
		}
		if dockerHealthy() {
			ctx := context.Background()
			c, err := tckafka.Run(ctx, "confluentinc/confluent-local:7.5.0", tckafka.WithClusterID("idem-test"))
			if err != nil {
				kafkaErr = fmt.Errorf("testenv: start kafka container: %w", err)
				return
			}
			brokers, err := c.Brokers(ctx)
			kafkaEnv, kafkaErr = &Kafka{Brokers: brokers, Kind: "testcontainers"}, err
			return
		}
		if os.Getenv("IDEM_REQUIRE_REAL_KAFKA") == "1" {
			kafkaErr = errors.New("testenv: IDEM_REQUIRE_REAL_KAFKA=1 but KAFKA_BROKERS is not set and no Docker engine answers; run `make services`")
			return
		}
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			kafkaErr = fmt.Errorf("testenv: start kfake: %w", err)
			return
		}
		kafkaEnv = &Kafka{Brokers: c.ListenAddrs(), Kind: "kfake"}
	})
	if kafkaErr != nil {
		tb.Fatal(kafkaErr)
	}
	tb.Logf("testenv: kafka broker: %s %v", kafkaEnv.Kind, kafkaEnv.Brokers)
	return kafkaEnv
}

// SaramaConfig returns a sarama config for this broker: the right protocol
// version, acks=all and return of successes (for SyncProducer). It is named
// like idemtest.Kafka.SaramaConfig, which means the same for users; in both
// kits Config would be a consumer.Config.
func (k *Kafka) SaramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = KafkaVersion
	c.Producer.Return.Successes = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	if k.configure != nil {
		k.configure(c)
	}
	return c
}

// Admin returns a cluster admin closed when the test ends.
func (k *Kafka) Admin(tb testing.TB) sarama.ClusterAdmin {
	tb.Helper()
	a, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		tb.Fatalf("testenv: kafka admin: %v", err)
	}
	tb.Cleanup(func() { _ = a.Close() })
	return a
}

// Topic creates a topic with a unique name and the given number of partitions,
// and deletes it when the test ends.
func (k *Kafka) Topic(tb testing.TB, partitions int32) string {
	tb.Helper()
	name := Unique("t_" + tb.Name())
	k.CreateTopic(tb, name, partitions)
	return name
}

// CreateTopic creates name with the given partitions (replication factor 1),
// waits until its metadata is visible, and deletes it when the test ends.
func (k *Kafka) CreateTopic(tb testing.TB, name string, partitions int32) {
	tb.Helper()
	a := k.Admin(tb)
	err := a.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		tb.Fatalf("testenv: create topic %s: %v", name, err)
	}
	tb.Cleanup(func() { k.DeleteTopics(tb, name) })
	k.WaitTopic(tb, name, partitions)
}

// DeleteTopics deletes topics (and whatever idem created beside them, such as
// retry tiers, when their names are passed), logging failures.
func (k *Kafka) DeleteTopics(tb testing.TB, names ...string) {
	a, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		tb.Logf("testenv: delete topics: %v", err)
		return
	}
	defer a.Close()
	for _, n := range names {
		if err := a.DeleteTopic(n); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			tb.Logf("testenv: delete topic %s: %v", n, err)
		}
	}
}

// WaitTopic polls until topic shows partitions partitions with leaders, and
// each leader answers for its partition. Metadata names a leader before that
// broker has made the partition's log, and meanwhile a fetch or a produce is
// refused with NOT_LEADER_OR_FOLLOWER ("Your metadata is out of date"), which
// failed tests that consumed a topic right after creating it.
func (k *Kafka) WaitTopic(tb testing.TB, topic string, partitions int32) {
	tb.Helper()
	c, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		tb.Fatalf("testenv: kafka client: %v", err)
	}
	defer c.Close()
	Eventually(tb, 30*time.Second, func() error {
		if err := c.RefreshMetadata(topic); err != nil {
			return err
		}
		ps, err := c.Partitions(topic)
		if err != nil {
			return err
		}
		if int32(len(ps)) < partitions {
			return fmt.Errorf("topic %s has %d of %d partitions", topic, len(ps), partitions)
		}
		for _, p := range ps {
			if _, err := c.Leader(topic, p); err != nil {
				return err
			}
			if _, err := c.GetOffset(topic, p, sarama.OffsetNewest); err != nil {
				return fmt.Errorf("topic %s partition %d: %w", topic, p, err)
			}
		}
		return nil
	})
}

// Group returns a unique consumer group name.
func Group(tb testing.TB) string {
	tb.Helper()
	return Unique("g_" + tb.Name())
}

// Producer returns a sync producer closed when the test ends. It is
// idempotent, so a retried batch is written once: sarama retries a batch whose
// connection broke after the request was sent (under load a concurrent
// metadata refresh closes a connection that is still opening, with a produce
// request in flight), and without idempotence the broker would append it
// twice. Tests count the records they produce exactly.
func (k *Kafka) Producer(tb testing.TB) sarama.SyncProducer {
	tb.Helper()
	cfg := k.SaramaConfig()
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Idempotent = true // with RequiredAcks = WaitForAll (Config)
	cfg.Net.MaxOpenRequests = 1    // sarama requires it with Idempotent
	p, err := sarama.NewSyncProducer(k.Brokers, cfg)
	if err != nil {
		tb.Fatalf("testenv: producer: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// Eventually polls f until it returns nil or timeout passes, then fails the test
// with f's last error. It is the way tests wait: never time.Sleep.
func Eventually(tb testing.TB, timeout time.Duration, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	interval := 10 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: condition not met within %s: %v", timeout, err)
		}
		time.Sleep(interval) // polling interval, not synchronisation
		if interval < 200*time.Millisecond {
			interval *= 2
		}
	}
}

// FreePortRange returns base such that the n ports base … base+n-1 were all
// free a moment ago (scripts/services.sh's three-node layout needs six
// consecutive ports: KAFKA_PORT=base, KAFKA_CONTROLLER_PORT=base+1). It picks
// them in 20000–32700, below Linux's ephemeral range (32768–60999), so that
// no outgoing connection takes one before the broker binds it.
func FreePortRange(tb testing.TB, n int) int {
	tb.Helper()
	for range 100 {
		base := 20000 + 2*rand.IntN(6000)
		free := true
		for p := base; p < base+n && free; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				free = false
				continue
			}
			l.Close()
		}
		if free {
			return base
		}
	}
	tb.Fatalf("testenv: no %d free consecutive ports", n)
	return 0
}

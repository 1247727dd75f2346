package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"

	"github.com/idemhq/idem/internal/testing/testkit"
	"github.com/idemhq/idem/internal/wire"
)

// KafkaVersion is the protocol version tests give sarama: idem's own
// (internal/wire). Kafka 4 rejects the old protocol versions
// sarama's default (2.8) would pick.
var KafkaVersion = wire.KafkaVersion

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
	containerOnce    sync.Once
	containerBrokers []string
	containerErr     error
)

// NewKafka returns the test broker (see the package doc for the choice) and
// logs which broker runs. With KAFKA_BROKERS set or no Docker engine, the
// choice is testkit.Connect's, as idemtest.Connect's: that real broker, else
// an in-process cluster (a failure with IDEM_REQUIRE_REAL_KAFKA=1), one for
// the whole test binary, so that calls from one test, its subtests and its
// helpers meet on one cluster. Without KAFKA_BROKERS and with Docker, one
// testcontainers broker serves the whole test binary.
func NewKafka(tb testing.TB) *Kafka {
	tb.Helper()
	SkipIfShort(tb)
	var k *Kafka
	if os.Getenv("KAFKA_BROKERS") == "" && dockerHealthy() {
		containerOnce.Do(func() {
			ctx := context.Background()
			c, err := tckafka.Run(ctx, "confluentinc/confluent-local:7.5.0", tckafka.WithClusterID("idem-test"))
			if err != nil {
				containerErr = fmt.Errorf("testenv: start kafka container: %w", err)
				return
			}
			containerBrokers, containerErr = c.Brokers(ctx)
		})
		if containerErr != nil {
			tb.Fatal(containerErr)
		}
		k = &Kafka{Brokers: containerBrokers, Kind: "testcontainers"}
	} else {
		brokers, real := testkit.Connect(tb, true)
		k = &Kafka{Brokers: brokers, Kind: "env"}
		if !real {
			k.Kind = "kfake"
		}
	}
	tb.Logf("testenv: kafka broker: %s %v", k.Kind, k.Brokers)
	return k
}

// kit is the broker as the harness under idemtest sees it, with this
// broker's client settings (security included).
func (k *Kafka) kit() testkit.Cluster {
	return testkit.Cluster{Brokers: k.Brokers, Config: k.SaramaConfig}
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
	return testkit.Admin(tb, k.Brokers, k.SaramaConfig())
}

// Topic creates a topic with a unique name and the given number of partitions,
// as idemtest.Kafka.Topic does: deleted when the test ends, with the retry
// tiers and the dead-letter topic named after it.
func (k *Kafka) Topic(tb testing.TB, partitions int32) string {
	tb.Helper()
	return k.kit().Topic(tb, "t_"+tb.Name(), partitions)
}

// CreateTopic creates name with the given partitions (replication factor 1;
// an existing topic is kept), waits until each partition's leader answers,
// and deletes it, with the topics named after it and a dot, when the test
// ends.
func (k *Kafka) CreateTopic(tb testing.TB, name string, partitions int32) {
	tb.Helper()
	k.kit().CreateTopic(tb, name, partitions, true)
	tb.Cleanup(func() { k.kit().DeleteTopicTree(tb, name) })
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
// each leader answers for its partition (testkit.Cluster.WaitTopic says why).
func (k *Kafka) WaitTopic(tb testing.TB, topic string, partitions int32) {
	tb.Helper()
	k.kit().WaitTopic(tb, topic, partitions)
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
// twice. Tests count the records they produce exactly. It retries a refused
// batch for about 6 s (testkit.ProducerConfig).
func (k *Kafka) Producer(tb testing.TB) sarama.SyncProducer {
	tb.Helper()
	cfg := k.SaramaConfig()
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	testkit.ProducerConfig(cfg) // with RequiredAcks = WaitForAll (SaramaConfig)
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
	testkit.Eventually(tb, timeout, f)
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

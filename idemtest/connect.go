package idemtest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/IBM/sarama"
)

// Connect returns the Kafka a test runs against, chosen by the environment:
//
//   - KAFKA_BROKERS set (comma-separated host:port, as `make services`
//     writes it): that cluster. It is shared by every test and every run, so
//     take names from [Kafka.Topic] and [Kafka.Group], which are unique and
//     cleaned up when the test ends.
//   - KAFKA_BROKERS unset: a new in-process cluster, as [NewKafka] starts.
//     IDEM_REQUIRE_REAL_KAFKA=1 fails the test instead, so that a CI job
//     meant to run on a real broker never passes on the in-process one.
//
// One test body then runs on either: quick on a laptop with nothing
// started, and against a real broker in CI.
func Connect(tb testing.TB) *Kafka {
	tb.Helper()
	var brokers []string
	for _, b := range strings.Split(os.Getenv("KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) > 0 {
		return &Kafka{Brokers: brokers}
	}
	if os.Getenv("IDEM_REQUIRE_REAL_KAFKA") == "1" {
		tb.Fatalf("idemtest: IDEM_REQUIRE_REAL_KAFKA=1 but KAFKA_BROKERS is not set: start a broker (make services) and export KAFKA_BROKERS (set -a; . .state/services.env; set +a)")
	}
	return NewKafka(tb)
}

// Topic creates a topic with the given number of partitions, named prefix
// followed by "_" and a random suffix (so tests on a shared broker never
// meet), and returns the name. When the test ends it is deleted, together
// with every topic whose name starts with it and a dot: the retry tiers and
// the dead-letter topic consumer.Run created for it
// ("<topic>.<group>.retry.<n>", "<topic>.<group>.dlq"). Deletion failures
// are logged, not fatal.
func (k *Kafka) Topic(tb testing.TB, prefix string, partitions int32) string {
	tb.Helper()
	name := unique(prefix)
	k.CreateTopic(tb, name, partitions)
	tb.Cleanup(func() { k.deleteTopics(tb, name) })
	return name
}

// Group returns a consumer group name for this test: prefix followed by "_"
// and a random suffix. When the test ends the group is deleted from the
// broker (after the consumers Start started in the test have stopped, as
// cleanups run last-in first-out); failures are logged, not fatal.
func (k *Kafka) Group(tb testing.TB, prefix string) string {
	tb.Helper()
	name := unique(prefix)
	tb.Cleanup(func() {
		admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
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

// deleteTopics deletes topic and every topic named topic + "." + anything.
func (k *Kafka) deleteTopics(tb testing.TB, topic string) {
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
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

// unique returns prefix, lower-cased with every character outside
// [a-z0-9_] made "_" and cut to 40 characters, then "_" and 12 random hex
// digits: a valid Kafka topic or group name and PostgreSQL identifier.
func unique(prefix string) string {
	p := []byte(strings.ToLower(prefix))
	for i, c := range p {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			p[i] = '_'
		}
	}
	if len(p) > 40 {
		p = p[:40]
	}
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return string(p) + "_" + hex.EncodeToString(b[:])
}

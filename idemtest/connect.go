package idemtest

import (
	"testing"

	"github.com/idemhq/idem/internal/testing/testkit"
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
	brokers, _ := testkit.Connect(tb, false)
	return &Kafka{Brokers: brokers}
}

// Topic creates a topic with the given number of partitions, named prefix
// followed by "_" and a random suffix (so tests on a shared broker never
// meet), waits until every partition's leader answers, and returns the
// name. When the test ends it is deleted, together with every topic whose
// name starts with it and a dot: the retry tiers and the dead-letter topic
// consumer.Run created for it ("<topic>.<group>.retry.<n>",
// "<topic>.<group>.dlq"). Deletion failures are logged, not fatal.
func (k *Kafka) Topic(tb testing.TB, prefix string, partitions int32) string {
	tb.Helper()
	return k.kit().Topic(tb, prefix, partitions)
}

// Group returns a consumer group name for this test: prefix followed by "_"
// and a random suffix. When the test ends the group is deleted from the
// broker (after the consumers Start started in the test have stopped, as
// cleanups run last-in first-out); failures are logged, not fatal.
func (k *Kafka) Group(tb testing.TB, prefix string) string {
	tb.Helper()
	return k.kit().Group(tb, prefix)
}

// kit is the cluster as the harness under idemtest and idem's own tests
// sees it.
func (k *Kafka) kit() testkit.Cluster {
	return testkit.Cluster{Brokers: k.Brokers, Config: k.SaramaConfig}
}

package testenv_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/testenv"
)

// testenv's topics are cleaned up as idemtest's are: when the test ends the
// topic goes with every topic named after it and a dot (the retry tiers and
// the DLQ a consumer made), whether Topic or CreateTopic made it.
func TestTopicsGoWithTheirTiers(t *testing.T) {
	t.Parallel()
	k := testenv.NewKafka(t)
	var topics []string
	t.Run("test", func(t *testing.T) {
		topic := k.Topic(t, 1)
		named := testenv.Unique("named")
		k.CreateTopic(t, named, 1)
		k.CreateTopic(t, named, 1) // an existing topic is kept
		admin := k.Admin(t)
		for _, base := range []string{topic, named} {
			for _, tier := range []string{base + ".g.retry.1", base + ".g.dlq"} { // as consumer.Run makes them
				if err := admin.CreateTopic(tier, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1}, false); err != nil {
					t.Fatal(err)
				}
				k.WaitTopic(t, tier, 1)
			}
		}
		topics = []string{topic, named}
	})
	admin := k.Admin(t)
	testenv.Eventually(t, 30*time.Second, func() error {
		all, err := admin.ListTopics()
		if err != nil {
			return err
		}
		for name := range all {
			for _, base := range topics {
				if strings.HasPrefix(name, base) {
					return fmt.Errorf("topic %s left after the test", name)
				}
			}
		}
		return nil
	})
}

// testenv's schema is empty (migration tests need it so), its pool holds at
// most 16 connections and PoolOnSchema's 4.
func TestPostgresSchemaIsEmpty(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.PostgresSchema(t)
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	var cur string
	if err := pool.QueryRow(t.Context(), `SELECT current_schema()`).Scan(&cur); err != nil || cur != schema {
		t.Fatalf("current_schema() = %q, %v; want %q", cur, err, schema)
	}
	if n != 0 {
		t.Fatalf("%d tables in a new schema, want 0", n)
	}
	if got := pool.Config().MaxConns; got != 16 {
		t.Errorf("PostgresSchema pool: MaxConns = %d, want 16", got)
	}
	if got := testenv.PoolOnSchema(t, schema).Config().MaxConns; got != 4 {
		t.Errorf("PoolOnSchema pool: MaxConns = %d, want 4", got)
	}
}

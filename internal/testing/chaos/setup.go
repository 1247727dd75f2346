package chaos

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file is what a run sets up before its producer and faults, shared by
// RunMode, RunSwarm and the static-membership figure: the config of the
// harness's own Kafka clients, the topics (created, then waited for until the
// metadata lists them), and the first member, which creates the schema, with
// the orders the payments pay inserted after it.

// saramaConfig is the harness's own clients' config.
func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V4_0_0_0
	c.ClientID = "chaos-harness"
	return c
}

// createTopic creates topic with the run's partition count, replication
// factor rf and configs.
func createTopic(brokers []string, topic string, rf int16, configs map[string]*string) error {
	return createTopicN(brokers, topic, partitions, rf, configs)
}

// createTopicN creates topic with n partitions, replication factor rf and
// configs; an existing topic is left alone.
func createTopicN(brokers []string, topic string, n int32, rf int16, configs map[string]*string) error {
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	d := &sarama.TopicDetail{NumPartitions: n, ReplicationFactor: rf, ConfigEntries: configs}
	if err := admin.CreateTopic(topic, d, false); err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	// Creation is asynchronous: wait until the metadata lists the topic, so
	// that a member started next finds it.
	for deadline := time.Now().Add(30 * time.Second); ; {
		ds, err := admin.DescribeTopics([]string{topic})
		if err == nil && len(ds) == 1 && ds[0].Err == sarama.ErrNoError && len(ds[0].Partitions) == int(n) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("topic %s not in the metadata 30s after its creation", topic)
		}
		time.Sleep(100 * time.Millisecond) // polling interval
	}
}

// firstMember starts member m1, which creates the schema, and inserts the
// orders in the database at url, through the pool it returns.
func firstMember(ctx context.Context, fl *fleet, url string, orders []string) (*pgxpool.Pool, error) {
	if err := fl.start("m1"); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	if err := insertOrders(ctx, pool, orders); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// insertOrders waits for the first member to create the schema, then
// inserts the pending orders.
func insertOrders(ctx context.Context, pool *pgxpool.Pool, orders []string) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, err := pool.Exec(ctx, `INSERT INTO orders (id) SELECT unnest($1::text[])`, orders)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("insert %d orders (did the first member create the schema?): %w", len(orders), err)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

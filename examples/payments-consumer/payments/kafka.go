package payments

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
)

// saramaConfig is the base sarama config of every client here. Kafka 4
// accepts only protocol versions from 4.0 on.
func saramaConfig(clientID string) *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V4_0_0_0
	c.ClientID = clientID
	return c
}

// ensureTopic creates topic with partitions partitions (the broker's default
// replication factor) unless it exists, and waits until every partition has a
// leader. It reports whether it created the topic.
func ensureTopic(ctx context.Context, client sarama.Client, admin sarama.ClusterAdmin, topic string, partitions int32) (bool, error) {
	created := true
	err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: -1}, false)
	switch {
	case errors.Is(err, sarama.ErrTopicAlreadyExists):
		created = false
	case err != nil:
		return false, fmt.Errorf("create topic %s: %w", topic, err)
	}
	// Creation is asynchronous on the broker: poll until the leaders answer.
	for {
		if _, err := endOffsets(client, topic); err == nil {
			return created, nil
		}
		select {
		case <-ctx.Done():
			return created, fmt.Errorf("topic %s has no leaders yet: %w", topic, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// endOffsets returns the log-end offset of every partition of topic.
func endOffsets(client sarama.Client, topic string) (map[int32]int64, error) {
	if err := client.RefreshMetadata(topic); err != nil {
		return nil, err
	}
	ps, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("topic %s: no partitions", topic)
	}
	ends := make(map[int32]int64, len(ps))
	for _, p := range ps {
		off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, fmt.Errorf("end offset of %s/%d: %w", topic, p, err)
		}
		ends[p] = off
	}
	return ends, nil
}

// countRecords is the number of records in topic: the sum of its end offsets
// (the demo's topics are fresh and never compacted or truncated).
func countRecords(client sarama.Client, topic string) (int64, error) {
	ends, err := endOffsets(client, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, e := range ends {
		n += e
	}
	return n, nil
}

// lag is how many records of topics group has not committed yet. It reads
// the committed offsets before the end offsets: a record forwarded to a retry
// tier is acknowledged before its source offset is committed, so a commit
// seen here has its tier record counted, and lag is never 0 too early.
func lag(client sarama.Client, admin sarama.ClusterAdmin, group string, topics []string) (int64, error) {
	req := map[string][]int32{}
	for _, t := range topics {
		if err := client.RefreshMetadata(t); err != nil {
			return 0, err
		}
		ps, err := client.Partitions(t)
		if err != nil {
			return 0, err
		}
		req[t] = ps
	}
	resp, err := admin.ListConsumerGroupOffsets(group, req)
	if err != nil {
		return 0, fmt.Errorf("committed offsets of group %s: %w", group, err)
	}
	var total int64
	for _, t := range topics {
		ends, err := endOffsets(client, t)
		if err != nil {
			return 0, err
		}
		for p, end := range ends {
			committed := int64(0) // no commit yet (-1) counts from the start
			if b := resp.GetBlock(t, p); b != nil && b.Offset > 0 {
				committed = b.Offset
			}
			total += max(0, end-committed)
		}
	}
	return total, nil
}

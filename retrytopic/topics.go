package retrytopic

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
)

// PartitionMismatchError is returned by EnsureTopics when a tier or
// dead-letter topic exists with fewer partitions than the source topic: records
// could then not keep their partition number, and per-key order would break.
// Add partitions to the topic (kafka-topics --alter --partitions) or delete it.
type PartitionMismatchError struct {
	Topic  string // the tier or dead-letter topic
	Found  int32  // its partitions
	Wanted int32  // at least this many (the source topic's)
}

// Error describes the failure in one line.
func (e *PartitionMismatchError) Error() string {
	return fmt.Sprintf("retrytopic: topic %s has %d partitions, want at least %d (as many as the source topic)", e.Topic, e.Found, e.Wanted)
}

// EnsureTopics makes sure every topic in topics exists with at least
// partitions partitions (the source topic's count). Missing topics are
// created with exactly partitions partitions, policy.ReplicationFactor and
// retention.ms = policy.Retention (defaults applied); existing topics are not
// altered. An existing topic with fewer partitions gives a
// *PartitionMismatchError naming it, and the other topics are still checked
// (errors are joined).
//
// It is idempotent and safe to call from several processes at once: a topic
// created meanwhile by someone else (TOPIC_ALREADY_EXISTS) counts as existing
// and is checked like one. ctx is checked between topics; each admin call is
// bounded by the admin's Admin.Timeout. Topics created here may take a moment
// to show in the metadata of other clients.
func EnsureTopics(ctx context.Context, admin sarama.ClusterAdmin, topics []string, partitions int32, policy Policy) error {
	if partitions < 1 {
		return fmt.Errorf("retrytopic: EnsureTopics: partitions = %d, must be >= 1", partitions)
	}
	policy = policy.WithDefaults()
	retention := int64(-1)
	if policy.Retention > 0 {
		retention = policy.Retention.Milliseconds()
	}
	retentionStr := strconv.FormatInt(retention, 10)
	rf := policy.ReplicationFactor

	var errs []error
	for _, topic := range topics {
		if err := ctx.Err(); err != nil {
			return err
		}
		found, exists, err := describe(admin, topic)
		if err != nil {
			return fmt.Errorf("retrytopic: describe topic %s: %w", topic, err)
		}
		if !exists {
			err := admin.CreateTopic(topic, &sarama.TopicDetail{
				NumPartitions:     partitions,
				ReplicationFactor: rf,
				ConfigEntries:     map[string]*string{"retention.ms": &retentionStr},
			}, false)
			if err == nil {
				continue
			}
			if !errors.Is(err, sarama.ErrTopicAlreadyExists) {
				return fmt.Errorf("retrytopic: create topic %s (%d partitions): %w", topic, partitions, err)
			}
			// Created concurrently: check it like an existing topic.
			found, err = describeCreated(ctx, admin, topic)
			if err != nil {
				return fmt.Errorf("retrytopic: describe topic %s: %w", topic, err)
			}
		}
		if found < partitions {
			errs = append(errs, &PartitionMismatchError{Topic: topic, Found: found, Wanted: partitions})
		}
	}
	return errors.Join(errs...)
}

// describe returns topic's partition count, or exists=false.
func describe(admin sarama.ClusterAdmin, topic string) (partitions int32, exists bool, err error) {
	md, err := admin.DescribeTopics([]string{topic})
	if err != nil {
		return 0, false, err
	}
	for _, m := range md {
		if m.Name != topic {
			continue
		}
		switch {
		case errors.Is(m.Err, sarama.ErrUnknownTopicOrPartition):
			return 0, false, nil
		case m.Err != sarama.ErrNoError:
			return 0, false, m.Err
		}
		return int32(len(m.Partitions)), true, nil
	}
	return 0, false, nil
}

// describeCreated describes a topic someone else just created; its metadata
// may lag the creation for a moment, so it polls (bounded by ctx and 30s).
func describeCreated(ctx context.Context, admin sarama.ClusterAdmin, topic string) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	wait := 20 * time.Millisecond
	for {
		n, exists, err := describe(admin, topic)
		if err != nil {
			return 0, err
		}
		if exists && n > 0 {
			return n, nil
		}
		if err := WaitDue(ctx, time.Now().Add(wait), nil); err != nil {
			return 0, fmt.Errorf("topic exists but its metadata did not appear: %w", err)
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

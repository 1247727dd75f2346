package forward

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/idemhq/idem/retrytopic"
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
// bounded by the admin's Admin.Timeout. An admin call that no broker answered
// (IsUnreachable: a node killed and not yet fenced, for one) is retried for
// up to 30 seconds or until ctx ends; a topic's description then comes
// from another node. Creating a missing topic needs the controller the
// admin knows; while that node is down the creation is retried the same way.
// Topics created here may take a moment to show in the metadata of other
// clients.
func EnsureTopics(ctx context.Context, admin sarama.ClusterAdmin, topics []string, partitions int32, policy retrytopic.Policy) error {
	_, small, err := ensure(ctx, admin, topics, partitions, policy, nil)
	if err != nil {
		return err
	}
	return errors.Join(small...)
}

// ensure is EnsureTopics with extra config entries for the topics it creates.
// It returns the names it created itself, and the existing topics with
// fewer partitions than partitions apart from its error.
func ensure(ctx context.Context, admin sarama.ClusterAdmin, topics []string, partitions int32, policy retrytopic.Policy, extra map[string]string) (map[string]bool, []error, error) {
	if partitions < 1 {
		return nil, nil, fmt.Errorf("retrytopic: EnsureTopics: partitions = %d, must be >= 1", partitions)
	}
	policy = policy.WithDefaults()
	retention := int64(-1)
	if policy.Retention > 0 {
		retention = policy.Retention.Milliseconds()
	}
	configs := map[string]*string{"retention.ms": new(strconv.FormatInt(retention, 10))}
	for k, v := range extra {
		configs[k] = new(v)
	}
	rf := policy.ReplicationFactor

	created := map[string]bool{}
	var small []error
	for _, topic := range topics {
		if err := ctx.Err(); err != nil {
			return created, small, err
		}
		found, exists, err := describe(ctx, admin, topic)
		if err != nil {
			return created, small, fmt.Errorf("retrytopic: describe topic %s: %w", topic, err)
		}
		if !exists {
			err := persist(ctx, func() error {
				return admin.CreateTopic(topic, &sarama.TopicDetail{
					NumPartitions:     partitions,
					ReplicationFactor: rf,
					ConfigEntries:     configs,
				}, false)
			})
			if err == nil {
				created[topic] = true
				continue
			}
			if !errors.Is(err, sarama.ErrTopicAlreadyExists) {
				return created, small, fmt.Errorf("retrytopic: create topic %s (%d partitions): %w", topic, partitions, err)
			}
			// Created concurrently: check it like an existing topic.
			found, err = describeCreated(ctx, admin, topic)
			if err != nil {
				return created, small, fmt.Errorf("retrytopic: describe topic %s: %w", topic, err)
			}
		}
		if found < partitions {
			small = append(small, &PartitionMismatchError{Topic: topic, Found: found, Wanted: partitions})
		}
	}
	return created, small, nil
}

// HeaderHeadroom is the room, in bytes, that EnsureTopicsFor adds to the
// source topic's max.message.bytes for the tier and dead-letter topics it
// creates, and that a forward producer needs above the largest limit: idem's
// headers (idem-error and idem-forward-error up to 8 KiB each,
// idem-stack up to 8 KiB, the rest a few hundred bytes) and the
// record's framing fit in it.
const HeaderHeadroom = 64 << 10

// Sizes is what EnsureTopicsFor read and set.
type Sizes struct {
	// SourceMaxMessageBytes is the source topic's max.message.bytes.
	SourceMaxMessageBytes int64
	// MaxMessageBytes is the largest max.message.bytes among the source, its
	// tiers and its dead-letter topic. ProducerMaxMessageBytes gives the
	// Producer.MaxMessageBytes a forward producer needs for it.
	MaxMessageBytes int64
	// Warnings name existing tier or dead-letter topics that cannot hold what
	// the source holds, or may drop a record before it is due. Existing topics
	// are never altered; the caller should log these. Each is a *LimitWarning.
	Warnings []*LimitWarning
}

// ProducerMaxMessageBytes is the Producer.MaxMessageBytes a forward producer
// needs so that sarama never refuses, on its own, a record one of the topics
// would take: the largest limit plus HeaderHeadroom, below
// sarama.MaxRequestSize.
func (s Sizes) ProducerMaxMessageBytes() int {
	n := s.MaxMessageBytes + HeaderHeadroom
	if limit := int64(sarama.MaxRequestSize) - 1; n > limit {
		n = limit
	}
	return int(n)
}

// LimitWarning says an existing tier or dead-letter topic has a config that
// does not fit its source or its delay. It is not an error: idem still runs;
// a record too large for the topic is dead-lettered (as a stub if need be).
type LimitWarning struct {
	Topic  string // the tier or dead-letter topic
	Config string // Kafka topic config, e.g. "max.message.bytes" or "retention.ms", or "partitions"
	Found  int64  // its value on Topic
	Want   int64  // at least this
	Reason string // what Want is, e.g. "the source topic payments's max.message.bytes"
}

// Error describes the mismatch with both numbers.
func (w *LimitWarning) Error() string {
	return fmt.Sprintf("retrytopic: topic %s has %s=%d, less than %d (%s)", w.Topic, w.Config, w.Found, w.Want, w.Reason)
}

// EnsureTopicsFor creates the missing tier and dead-letter topics of source
// (as consumed by group) like EnsureTopics does, and makes them able to hold
// every record of source: it reads source's partition count and configs
// (DescribeConfigs) and creates each missing topic with
//
//	partitions        = source's partition count
//	retention.ms      = policy.Retention
//	max.message.bytes = source's max.message.bytes + HeaderHeadroom
//	segment.bytes     = source's, when source overrides it (never below max.message.bytes)
//
// Admin calls that no broker answered are retried as in EnsureTopics.
// Existing topics are not altered; one whose max.message.bytes is below the
// source's, or a tier whose retention.ms is below twice its delay, is
// reported in Sizes.Warnings. A tier with fewer partitions than the source
// is an error (*PartitionMismatchError), as in EnsureTopics: its records
// must keep their partition number, for per-key order. A dead-letter topic
// with fewer partitions is a warning only: nothing reads it in key order,
// and a record whose partition it lacks goes to one chosen by its key
// (Forwarder.Forward). A rule's dead-letter topic shared by sources of
// different partition counts is one such.
//
// The returned Sizes say how large a forward producer's
// Producer.MaxMessageBytes must be (Sizes.ProducerMaxMessageBytes).
func EnsureTopicsFor(ctx context.Context, admin sarama.ClusterAdmin, source, group string, policy retrytopic.Policy) (Sizes, error) {
	var sz Sizes
	partitions, exists, err := describe(ctx, admin, source)
	switch {
	case err != nil:
		return sz, fmt.Errorf("retrytopic: describe topic %s: %w", source, err)
	case !exists:
		return sz, fmt.Errorf("retrytopic: describe topic %s: %w", source, sarama.ErrUnknownTopicOrPartition)
	}
	src, err := topicConfig(ctx, admin, source)
	if err != nil {
		return sz, err
	}
	srcMax, err := src.int("max.message.bytes")
	if err != nil {
		return sz, err
	}
	sz.SourceMaxMessageBytes, sz.MaxMessageBytes = srcMax, srcMax
	created := srcMax + HeaderHeadroom
	extra := map[string]string{"max.message.bytes": strconv.FormatInt(created, 10)}
	if e, ok := src.entries["segment.bytes"]; ok && e.Source == sarama.SourceTopic {
		if seg, err := strconv.ParseInt(e.Value, 10, 64); err == nil {
			extra["segment.bytes"] = strconv.FormatInt(max(seg, created), 10)
		}
	}
	topics := policy.Topics(source, group)
	made, small, err := ensure(ctx, admin, topics, partitions, policy, extra)
	if err != nil {
		return sz, err
	}
	dlq := policy.DLQ(source, group)
	var tierErrs []error
	for _, e := range small {
		m := e.(*PartitionMismatchError)
		if m.Topic != dlq {
			tierErrs = append(tierErrs, m)
			continue
		}
		sz.Warnings = append(sz.Warnings, &LimitWarning{Topic: m.Topic, Config: "partitions", Found: int64(m.Found), Want: int64(m.Wanted),
			Reason: "the source topic " + source + "'s partition count; records of its other partitions go to partitions chosen by their key"})
	}
	if err := errors.Join(tierErrs...); err != nil {
		return sz, err
	}
	if len(made) > 0 {
		sz.MaxMessageBytes = max(sz.MaxMessageBytes, created)
	}
	delays := map[string]time.Duration{}
	for i, name := range policy.Tiers(source, group) {
		delays[name] = policy.Delays[i]
	}
	for _, topic := range topics {
		if made[topic] {
			continue
		}
		cfg, err := topicConfig(ctx, admin, topic)
		if err != nil {
			return sz, err
		}
		mmb, err := cfg.int("max.message.bytes")
		if err != nil {
			return sz, err
		}
		sz.MaxMessageBytes = max(sz.MaxMessageBytes, mmb)
		if mmb < srcMax {
			sz.Warnings = append(sz.Warnings, &LimitWarning{Topic: topic, Config: "max.message.bytes", Found: mmb, Want: srcMax,
				Reason: "the source topic " + source + "'s max.message.bytes; larger records are dead-lettered, as stubs without their value if need be"})
		}
		if d, ok := delays[topic]; ok {
			if ret, err := cfg.int("retention.ms"); err == nil && ret >= 0 && ret < 2*d.Milliseconds() {
				sz.Warnings = append(sz.Warnings, &LimitWarning{Topic: topic, Config: "retention.ms", Found: ret, Want: 2 * d.Milliseconds(),
					Reason: "twice the tier's delay " + d.String() + "; a record may expire before it is due"})
			}
		}
	}
	return sz, nil
}

// configs is a topic's config entries by name.
type configs struct {
	topic   string
	entries map[string]sarama.ConfigEntry
}

// int returns the value of config name as a number.
func (c configs) int(name string) (int64, error) {
	e, ok := c.entries[name]
	if !ok {
		return 0, fmt.Errorf("retrytopic: topic %s: config %s not described", c.topic, name)
	}
	n, err := strconv.ParseInt(e.Value, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("retrytopic: topic %s: config %s=%q: %w", c.topic, name, e.Value, err)
	}
	return n, nil
}

// topicConfig describes topic's size and retention configs. The request
// goes to a random broker; one that does not answer is retried (persist),
// which picks another.
func topicConfig(ctx context.Context, admin sarama.ClusterAdmin, topic string) (configs, error) {
	out := configs{topic: topic, entries: map[string]sarama.ConfigEntry{}}
	var results []*sarama.ConfigResourceResult
	err := persist(ctx, func() (err error) {
		results, err = admin.DescribeConfigs([]*sarama.ConfigResource{{Type: sarama.TopicResource, Name: topic,
			ConfigNames: []string{"max.message.bytes", "segment.bytes", "retention.ms"}}}, sarama.DescribeConfigsOptions{})
		return err
	})
	if err != nil {
		return out, fmt.Errorf("retrytopic: describe configs of topic %s: %w", topic, err)
	}
	for _, r := range results {
		if r.Name != topic {
			continue
		}
		if r.ErrorCode != sarama.ErrNoError {
			return out, fmt.Errorf("retrytopic: describe configs of topic %s: %w (%s)", topic, r.ErrorCode, r.ErrorMsg)
		}
		for _, e := range r.Configs {
			out.entries[e.Name] = e
		}
	}
	return out, nil
}

// describe returns topic's partition count, or exists=false.
//
// sarama's DescribeTopics asks the broker the admin's client takes for the
// controller. In a multi-node cluster that may be a node that was just
// killed: the others list it until the controller fences it, and the admin
// never asks anyone else. So when it does not answer (IsUnreachable),
// describe asks for the metadata of every topic with ListTopics, which
// tries another broker on a connection error; both are retried (persist)
// until one answers.
func describe(ctx context.Context, admin sarama.ClusterAdmin, topic string) (partitions int32, exists bool, err error) {
	err = persist(ctx, func() (err error) {
		partitions, exists, err = describeOnce(admin, topic)
		if !IsUnreachable(err) {
			return err
		}
		all, lerr := admin.ListTopics()
		if lerr != nil {
			return errors.Join(err, lerr)
		}
		d, ok := all[topic]
		partitions, exists = d.NumPartitions, ok
		return nil
	})
	return partitions, exists, err
}

// describeOnce is describe's DescribeTopics request.
func describeOnce(admin sarama.ClusterAdmin, topic string) (partitions int32, exists bool, err error) {
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
		n, exists, err := describe(ctx, admin, topic)
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

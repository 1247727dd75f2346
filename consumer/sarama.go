package consumer

import (
	"fmt"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// saramaConfig copies the user's base config and sets what idem's guarantees
// depend on.
func saramaConfig(cfg Config) *sarama.Config {
	c := *cfg.Sarama // shallow copy: idem only sets scalar fields and replaces slices
	if c.Version == sarama.DefaultVersion {
		c.Version = wire.KafkaVersion
	}
	// Offsets: only what idem marks after a durable outcome is committed; the
	// committer runs every CommitInterval and at revoke/shutdown.
	c.Consumer.Offsets.AutoCommit.Enable = true
	c.Consumer.Offsets.AutoCommit.Interval = cfg.CommitInterval
	if cfg.Transactions.Enabled {
		// The transactions are the only offset writer: sarama's committer
		// never runs (nothing is marked with it either).
		c.Consumer.Offsets.AutoCommit.Enable = false
	}
	// StartAt decides (Config.Sarama's doc); Run warns when the base config
	// asked otherwise (warnIgnoredInitial).
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	if cfg.StartAt == StartNewest {
		c.Consumer.Offsets.Initial = sarama.OffsetNewest
	}
	// Records of aborted transactions never reach a handler.
	c.Consumer.IsolationLevel = sarama.ReadCommitted
	if cfg.ReadUncommitted {
		c.Consumer.IsolationLevel = sarama.ReadUncommitted
	}
	// idem creates only its own tiers and DLQs, explicitly; never by a
	// metadata request or a produce.
	c.Metadata.AllowAutoTopicCreation = false
	c.Consumer.Return.Errors = true
	// Static membership (Config.InstanceID); "" keeps sarama's dynamic one.
	c.Consumer.Group.InstanceId = cfg.InstanceID
	if s := c.Consumer.Group.Rebalance.GroupStrategies; len(s) == 0 || (len(s) == 1 && s[0].Name() == sarama.RangeBalanceStrategyName) {
		c.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyCooperativeSticky()}
	}
	// Forwards to retry tiers and the DLQ must be acked by all in-sync
	// replicas, never duplicated by the producer's own retries, and keep
	// their partition number.
	retrytopic.ConfigureProducer(&c)
	if c.Producer.Retry.Max < 5 {
		c.Producer.Retry.Max = 5
	}
	return &c
}

// StartPosition is where a group without a committed offset starts reading.
type StartPosition int

const (
	// StartOldest reads from the oldest retained record. The default.
	StartOldest StartPosition = iota
	// StartNewest reads only records produced after the group joined.
	StartNewest
)

// String returns "oldest" or "newest".
func (s StartPosition) String() string {
	switch s {
	case StartOldest:
		return "oldest"
	case StartNewest:
		return "newest"
	}
	return fmt.Sprintf("StartPosition(%d)", int(s))
}

// startAt checks Config.StartAt.
func (c configCheck) startAt() {
	if c.StartAt != StartOldest && c.StartAt != StartNewest {
		c.errs.Bad("StartAt", c.StartAt, "unknown start position")
	}
}

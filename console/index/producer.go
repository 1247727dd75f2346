package index

import (
	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/failidx"
)

// ProducerConfig returns a copy of base (sarama defaults with Version
// V4_0_0_0 when nil) set up for the Kafka client console.Config.Client
// takes, through which the console replays records: idempotent, acks=all,
// successes returned (retrytopic.ConfigureProducer), and
// Metadata.AllowAutoTopicCreation = false, so a replay never creates a
// topic.
func ProducerConfig(base *sarama.Config) *sarama.Config { return failidx.ProducerConfig(base) }

package failidx

import (
	"github.com/IBM/sarama"

	"github.com/idemhq/idem/retrytopic"
)

// ProducerConfig returns a copy of base (sarama defaults with Version
// V4_0_0_0 when nil) set up for the client Actions publish through:
// retrytopic.ConfigureProducer (idempotent, acks=all, successes returned)
// and Metadata.AllowAutoTopicCreation = false. The CLI builds its clients
// with it; a service that mounts the console calls
// retrytopic.ConfigureProducer itself (console.Config.Client).
func ProducerConfig(base *sarama.Config) *sarama.Config {
	var c sarama.Config
	if base == nil {
		c = *sarama.NewConfig()
		c.Version = sarama.V4_0_0_0
	} else {
		c = *base
	}
	retrytopic.ConfigureProducer(&c)
	c.Metadata.AllowAutoTopicCreation = false
	return &c
}

package retrytopic

import "github.com/IBM/sarama"

// ConfigureProducer sets on cfg what a producer that forwards records needs
// (idem's own for retry tiers, and the client given to dlq.New for replay) so
// that an acknowledged forward is durable and never duplicated by producer
// retries:
//
//	cfg.Producer.Idempotent = true              // Kafka: enable.idempotence=true
//	cfg.Net.MaxOpenRequests = 1                 // sarama requires it with Idempotent
//	cfg.Producer.RequiredAcks = sarama.WaitForAll // Kafka: acks=all
//	cfg.Producer.Return.Successes = true        // SyncProducer requires it
//	cfg.Producer.Return.Errors = true
//	cfg.Producer.Partitioner = sarama.NewManualPartitioner // idem picks the partition
//	cfg.Producer.Flush.MaxMessages = 1          // one record per produce request
//	cfg.Producer.Flush.Messages = 0
//	cfg.Metadata.AllowAutoTopicCreation = false // idem never auto-creates a topic
//	cfg.Version = sarama.V4_0_0_0               // only when cfg.Version is older
//
// One record per request, because a broker refuses a whole batch
// (MESSAGE_TOO_LARGE when the batch exceeds the topic's max.message.bytes,
// though each record fits): a refusal must be the refused record's alone,
// or innocent records are sent on to their next form (a tier's record to
// the dead-letter topic, a dead-letter record as a stub). Forwards are rare
// and acks=all already allows one request in flight at a time.
//
// With auto-creation off, a forward to a topic that does not exist fails
// (UNKNOWN_TOPIC_OR_PARTITION, an outage: the caller waits and retries)
// instead of creating a topic nobody reads. Other settings (retries,
// timeouts, compression, Producer.MaxMessageBytes) are left as they are; the
// consumer sets the size limit of its own forward producer from the topics'
// max.message.bytes.
func ConfigureProducer(cfg *sarama.Config) {
	cfg.Metadata.AllowAutoTopicCreation = false
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Return.Errors = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Flush.MaxMessages = 1
	cfg.Producer.Flush.Messages = 0
	if !cfg.Version.IsAtLeast(sarama.V4_0_0_0) {
		cfg.Version = sarama.V4_0_0_0
	}
	if cfg.Producer.Retry.Max < 1 {
		cfg.Producer.Retry.Max = 1 // sarama: Idempotent needs Retry.Max >= 1
	}
}

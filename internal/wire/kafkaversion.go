package wire

// The Kafka protocol version idem gives sarama when a config leaves
// sarama's default: the one value the consumer, the outbox relay, the test
// kits and the benchmarks use.

import "github.com/IBM/sarama"

// KafkaVersion is the protocol version idem gives sarama when a base config
// leaves sarama's default (2.8): 4.0. Kafka 4 removed the old protocol
// versions (KIP-896), and 4.0 is the oldest a 4.x broker accepts; the
// cooperative-sticky assignor needs at least 2.4. A Kafka 3.x cluster may
// refuse its requests: a user with one sets Sarama.Version to the brokers'.
var KafkaVersion = sarama.V4_0_0_0

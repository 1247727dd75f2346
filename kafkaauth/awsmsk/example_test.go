package awsmsk_test

import (
	"log"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/kafkaauth"
	"github.com/idemhq/idem/kafkaauth/awsmsk"
)

// A consumer of an MSK cluster's IAM listener (TLS, port 9098) with the
// service's AWS identity: the default credential chain (EKS IRSA or Pod
// Identity, ECS, EC2, environment). docs/secured-clusters.md shows this
// block.
func Example() {
	msk := awsmsk.Config{Region: "eu-west-1"}
	if err := msk.Validate(); err != nil {
		log.Fatal(err)
	}
	kcfg := sarama.NewConfig()
	kcfg.Version = sarama.V3_9_0_0 // the cluster's Kafka version
	if err := kafkaauth.Apply(kcfg, kafkaauth.Options{TLS: true, Mechanism: "OAUTHBEARER", FetchToken: msk.Fetch}); err != nil {
		log.Fatal(err)
	}
	_ = consumer.Config{
		Brokers: []string{"b-1.orders.abc123.c2.kafka.eu-west-1.amazonaws.com:9098"},
		Sarama:  kcfg,
		// Group, Topics, Dedupe as usual
	}
}

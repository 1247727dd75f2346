package kafkaauth_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log"
	"os"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/kafkaauth"
)

// A consumer of a cluster that takes SASL/SCRAM over TLS: kafkaauth fills in
// Config.Sarama's Net.TLS and Net.SASL (with a SCRAM client, which sarama
// does not ship).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		return nil // the service's work, in the transaction of ctx
	})

	kcfg := sarama.NewConfig()
	kcfg.Version = sarama.V3_9_0_0 // the brokers' version (3.x clusters must set it)
	if err := kafkaauth.Apply(kcfg, kafkaauth.Options{
		CAFile:    "/etc/kafka/ca.pem", // implies TLS; leave empty for the system roots with TLS: true
		Mechanism: "SCRAM-SHA-512",
		User:      "orders",
		Password:  os.Getenv("KAFKA_PASSWORD"),
	}); err != nil {
		log.Fatal(err)
	}
	if err := consumer.Run(ctx, consumer.Config{
		Brokers: []string{"kafka-1:9093", "kafka-2:9093"},
		Group:   "orders",
		Topics:  []string{"orders"},
		Dedupe:  dedupe.NewPostgres(pool),
		Sarama:  kcfg,
	}, h); err != nil {
		log.Fatal(err)
	}
}

// The same settings written with sarama alone, here TLS with a client
// certificate and SASL/PLAIN (PLAIN sends the password as it is: only over
// TLS). For SCRAM, sarama also needs Net.SASL.SCRAMClientGeneratorFunc, a
// SCRAM client it does not ship: use Apply, which sets one.
func Example_saramaOnly() {
	ca, err := os.ReadFile("/etc/kafka/ca.pem")
	if err != nil {
		log.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	cert, err := tls.LoadX509KeyPair("/etc/kafka/client.pem", "/etc/kafka/client-key.pem")
	if err != nil {
		log.Fatal(err)
	}

	kcfg := sarama.NewConfig()
	kcfg.Version = sarama.V4_0_0_0
	kcfg.Net.TLS.Enable = true
	kcfg.Net.TLS.Config = &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	kcfg.Net.SASL.Enable = true
	kcfg.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	kcfg.Net.SASL.User = "orders"
	kcfg.Net.SASL.Password = os.Getenv("KAFKA_PASSWORD")

	_ = consumer.Config{Brokers: []string{"kafka-1:9093"}, Sarama: kcfg} // with Group, Topics, Dedupe as usual
}

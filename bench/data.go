package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/wire"
)

// keyCount is the number of distinct Kafka keys: k0…k4999.
const keyCount = 5000

func brokers() []string {
	b := os.Getenv("KAFKA_BROKERS")
	if b == "" {
		b = "127.0.0.1:9092"
	}
	return strings.Split(b, ",")
}

func adminConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = wire.KafkaVersion
	c.ClientID = "idem-bench"
	return c
}

// kafka holds the parent's client and admin.
type kafka struct {
	client sarama.Client
	admin  sarama.ClusterAdmin
}

func dialKafka() (*kafka, error) {
	c, err := sarama.NewClient(brokers(), adminConfig())
	if err != nil {
		return nil, fmt.Errorf("kafka at %v: %w", brokers(), err)
	}
	a, err := sarama.NewClusterAdminFromClient(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("kafka admin: %w", err)
	}
	return &kafka{client: c, admin: a}, nil
}

func (k *kafka) close() { _ = k.admin.Close() } // closes the client too

// records counts the records of topic (newest − oldest offsets) and its
// partitions; ok is false when the topic does not exist.
func (k *kafka) records(topic string) (n int64, parts int, ok bool, err error) {
	if err := k.client.RefreshMetadata(topic); err != nil {
		if errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			return 0, 0, false, nil
		}
		return 0, 0, false, err
	}
	ps, err := k.client.Partitions(topic)
	if err != nil {
		return 0, 0, false, err
	}
	for _, p := range ps {
		hi, err := k.client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return 0, 0, false, err
		}
		lo, err := k.client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return 0, 0, false, err
		}
		n += hi - lo
	}
	return n, len(ps), true, nil
}

// createTopic (re)creates topic with parts partitions, waiting out a
// deletion still in progress.
func (k *kafka) createTopic(ctx context.Context, topic string, parts int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := k.admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: int32(parts), ReplicationFactor: 1}, false)
		if err == nil || time.Now().After(deadline) {
			if err != nil {
				return fmt.Errorf("create topic %s: %w", topic, err)
			}
			break
		}
		var te *sarama.TopicError
		if !errors.As(err, &te) || (te.Err != sarama.ErrTopicAlreadyExists && te.Err != sarama.ErrRequestTimedOut) {
			return fmt.Errorf("create topic %s: %w", topic, err)
		}
		select { // a deletion of the same name is still in progress
		case <-time.After(500 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Wait until every partition has a leader.
	for time.Now().Before(deadline) {
		if err := k.client.RefreshMetadata(topic); err == nil {
			if ps, err := k.client.WritablePartitions(topic); err == nil && len(ps) == parts {
				return nil
			}
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return fmt.Errorf("topic %s: partitions have no leader after 60s", topic)
}

// deleteTopics deletes topic and every topic named "<topic>." or with one of
// the prefixes (idem's retry and DLQ topics of a group); errors are ignored,
// it is cleanup.
func (k *kafka) deleteTopics(names []string, prefixes ...string) {
	all, err := k.admin.ListTopics()
	if err != nil {
		return
	}
	for t := range all {
		del := false
		for _, n := range names {
			del = del || t == n
		}
		for _, p := range prefixes {
			del = del || strings.HasPrefix(t, p)
		}
		if del {
			_ = k.admin.DeleteTopic(t)
		}
	}
}

// producerConfig batches hard for the bulk load, or flushes every
// millisecond for the steady latency load.
func producerConfig(steady bool) *sarama.Config {
	c := adminConfig()
	c.Producer.Compression = sarama.CompressionLZ4
	c.Producer.RequiredAcks = sarama.WaitForLocal
	c.Producer.Return.Successes = false
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = sarama.NewHashPartitioner
	c.Producer.Flush.Bytes = 512 << 10
	c.Producer.Flush.Frequency = 10 * time.Millisecond
	c.Producer.MaxMessageBytes = 900_000 // under the broker's message.max.bytes (1 MB)
	c.ChannelBufferSize = 4096
	if steady {
		c.Producer.Flush.Bytes = 64 << 10
		c.Producer.Flush.Frequency = time.Millisecond
	}
	return c
}

// payload returns n pseudo-random printable bytes (compressible about as much
// as JSON), different for each i.
func payload(rng *rand.Rand, n int) []byte {
	const alphabet = `abcdefghijklmnopqrstuvwxyz0123456789 {}":,`
	b := make([]byte, n)
	for j := range b {
		b[j] = alphabet[rng.IntN(len(alphabet))]
	}
	return b
}

// produce writes n records to topic: key k(i mod 5000), value of size bytes,
// header idempotency-key "<prefix>-<i>" unique per record. rate 0 produces as
// fast as possible; otherwise at rate records per second, each stamped with
// the time it was handed to the producer. It returns when every record is
// acknowledged.
func produce(ctx context.Context, topic, prefix string, n, size int, rate float64) error {
	p, err := sarama.NewAsyncProducer(brokers(), producerConfig(rate > 0))
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		var first error
		for e := range p.Errors() {
			if first == nil {
				first = e.Err
			}
		}
		errc <- first
	}()
	rng := rand.New(rand.NewPCG(uint64(len(topic)), uint64(n)))
	vals := make([][]byte, 256) // a pool of values, so the load is cheap to generate
	for i := range vals {
		vals[i] = payload(rng, size)
	}
	start := time.Now()
	var sendErr error
loop:
	for i := 0; i < n; i++ {
		if rate > 0 && i%64 == 0 {
			for float64(time.Since(start))/float64(time.Second)*rate < float64(i) {
				time.Sleep(200 * time.Microsecond)
			}
		}
		m := &sarama.ProducerMessage{
			Topic:   topic,
			Key:     sarama.StringEncoder(fmt.Sprint("k", i%keyCount)),
			Value:   sarama.ByteEncoder(vals[i%len(vals)]),
			Headers: []sarama.RecordHeader{{Key: []byte(idemKeyHeader), Value: fmt.Appendf(nil, "%s-%d", prefix, i)}},
		}
		if rate > 0 {
			m.Timestamp = time.Now()
		}
		select {
		case p.Input() <- m:
		case <-ctx.Done():
			sendErr = ctx.Err()
			break loop
		}
	}
	p.AsyncClose()
	if err := <-errc; err != nil {
		return fmt.Errorf("produce to %s: %w", topic, err)
	}
	return sendErr
}

// kafkaVersion asks the broker: ApiVersions (v3+) carries its supported and
// finalized features; the highest metadata.version the software supports
// names its release.
func kafkaVersion(k *kafka) string {
	bs := k.client.Brokers()
	if len(bs) == 0 {
		return "unknown"
	}
	b := bs[0]
	if err := b.Open(k.client.Config()); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
		return "unknown: " + err.Error()
	}
	resp, err := b.ApiVersions(&sarama.ApiVersionsRequest{Version: 3, ClientSoftwareName: "idem-bench", ClientSoftwareVersion: "1"})
	if err != nil {
		return "unknown: " + err.Error()
	}
	for _, f := range resp.SupportedFeatures {
		if f.Name == "metadata.version" {
			if rel, ok := metadataVersions[f.MaxVersion]; ok {
				return fmt.Sprintf("%s (metadata.version %d)", rel, f.MaxVersion)
			}
			return fmt.Sprintf("metadata.version %d (%d APIs)", f.MaxVersion, len(resp.ApiKeys))
		}
	}
	return fmt.Sprintf("unknown (%d APIs)", len(resp.ApiKeys))
}

// metadataVersions names the Kafka release of the highest metadata.version
// level a broker supports (Kafka's MetadataVersion enum).
var metadataVersions = map[int16]string{
	27: "4.1", // seen on a 4.1.1 broker
}

package failidx

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
)

// publisher sends records and returns where they landed, keeping the
// record's partition number when the topic has it (else hashing the key).
type publisher struct {
	client   sarama.Client
	producer sarama.SyncProducer
}

func newPublisher(client sarama.Client) (*publisher, error) {
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		return nil, fmt.Errorf("index: producer: %w", err)
	}
	return &publisher{client: client, producer: p}, nil
}

func (p *publisher) close() { _ = p.producer.Close() }

func (p *publisher) send(ctx context.Context, rec forward.Record) (int32, int64, error) {
	part, err := p.partition(rec)
	if err != nil {
		return 0, 0, err
	}
	off, err := p.sendTo(ctx, rec, part)
	return part, off, err
}

// partition returns the partition rec goes to: its own number when topic
// has it, else its key's hash.
func (p *publisher) partition(rec forward.Record) (int32, error) {
	parts, err := p.client.Partitions(rec.Topic)
	if err != nil {
		return 0, fmt.Errorf("partitions of %s: %w", rec.Topic, err)
	}
	n := int32(len(parts))
	part := rec.Partition
	if part < 0 || part >= n {
		hp := sarama.NewHashPartitioner(rec.Topic)
		if part, err = hp.Partition(&sarama.ProducerMessage{Key: sarama.ByteEncoder(rec.Key)}, n); err != nil {
			return 0, err
		}
	}
	return part, nil
}

// sendTo sends rec to partition part and returns its offset.
func (p *publisher) sendTo(ctx context.Context, rec forward.Record, part int32) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	msg := &sarama.ProducerMessage{Topic: rec.Topic, Partition: part, Headers: rec.Headers}
	if rec.Key != nil {
		msg.Key = sarama.ByteEncoder(rec.Key)
	}
	if rec.Value != nil {
		msg.Value = sarama.ByteEncoder(rec.Value)
	}
	_, off, err := p.producer.SendMessage(msg)
	return off, err
}

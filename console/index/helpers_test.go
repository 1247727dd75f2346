package index

import (
	"context"
	"errors"
	"testing"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// dead is one dead letter to seed.
type dead = failidxtest.Dead

// producerClient returns a client set up for the index's actions, closed
// when the test ends.
func producerClient(t *testing.T, k *testenv.Kafka) sarama.Client {
	t.Helper()
	return failidxtest.Client(t, k, failidx.ProducerConfig(k.SaramaConfig()))
}

// mustList returns every record of the index f matches, each as Get reads
// it (List reads no values, stacks or headers).
func mustList(t *testing.T, s *failidx.Store, f failidx.Filter) []failidx.Record {
	t.Helper()
	p, err := s.List(testenv.Context(t), f, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range p.Records {
		if p.Records[i], err = s.Get(testenv.Context(t), r.ID); err != nil {
			t.Fatal(err)
		}
	}
	return p.Records
}

// runIndexer runs ix until the test ends.
func runIndexer(t *testing.T, ix *Indexer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ix.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Indexer.Run: %v", err)
		}
	})
}

func contextWithCancel() (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

// groupLag sums end offset minus group's committed offset over topics.
func groupLag(k *testenv.Kafka, group string, topics ...string) (int64, error) {
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		return 0, err
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return 0, err
	}
	var lag int64
	for _, topic := range topics {
		parts, err := client.Partitions(topic)
		if err != nil {
			return 0, err
		}
		resp, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
		if err != nil {
			return 0, err
		}
		for _, p := range parts {
			end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return 0, err
			}
			committed := int64(0)
			if b := resp.GetBlock(topic, p); b != nil && b.Offset >= 0 {
				committed = b.Offset
			}
			lag += end - committed
		}
	}
	return lag, nil
}

var errNotYet = errors.New("not yet")

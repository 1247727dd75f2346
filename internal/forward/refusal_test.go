package forward_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/forward"
)

// Issue 28, defect 5 (a batch-level MESSAGE_TOO_LARGE): records that each
// fit their destination, forwarded at once by several lanes, must each be
// accepted. A producer that batched them into one request of a partition
// got one MESSAGE_TOO_LARGE for the whole batch, which the consumer blamed
// on every record in it: innocent records went to their next form (a tier's
// record to the dead-letter topic, a dead-letter record as a stub).
func TestForwardRefusalIsPerRecord(t *testing.T) {
	t.Parallel()
	k := idemtest.Connect(t)
	admin := newAdmin(t, k)
	dest := k.Topic(t, "small-batches", 1)
	limit := "10000"
	if err := admin.AlterConfig(sarama.TopicResource, dest, map[string]*string{"max.message.bytes": &limit}, false); err != nil {
		t.Fatal(err)
	}
	f, client := newForwarder(t, k)
	client.Config().Producer.MaxMessageBytes = 1 << 20 // the largest of its destinations'
	const lanes = 24
	var wg sync.WaitGroup
	errs := make([]error, lanes)
	for i := range lanes {
		wg.Go(func() {
			errs[i] = f.Forward(context.Background(), forward.Record{Topic: dest, Partition: 0,
				Key: []byte(strconv.Itoa(i)), Value: make([]byte, 6000)})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if errors.Is(err, sarama.ErrMessageSizeTooLarge) {
			t.Errorf("record %d of 6,000 bytes refused by a topic taking 10,000: %v", i, err)
		} else if err != nil {
			t.Errorf("record %d: %v", i, err)
		}
	}
}

package index

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/pglead"
)

// claimHandler is the indexer's sarama.ConsumerGroupHandler.
type claimHandler struct{ ix *Indexer }

func (h *claimHandler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *claimHandler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim stores the claim's records in batches: whatever has arrived,
// up to BatchSize, in one transaction; then it marks the batch's last offset.
// A batch that cannot be stored is retried (with backoff) until it is, or the
// session ends: nothing is marked past a record that is not stored.
func (h *claimHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	batch := make([]*sarama.ConsumerMessage, 0, h.ix.BatchSize)
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-claim.Messages():
			if !ok {
				return nil
			}
			batch = append(batch[:0], m)
		more:
			for len(batch) < h.ix.BatchSize {
				select {
				case m, ok := <-claim.Messages():
					if !ok {
						break more
					}
					batch = append(batch, m)
				default:
					break more
				}
			}
			if !h.storeWithRetry(ctx, batch) {
				return nil
			}
			if h.ix.stored != nil {
				h.ix.stored(len(batch))
			}
			sess.MarkMessage(batch[len(batch)-1], "")
		}
	}
}

// storeWithRetry stores batch, retrying with full-jitter backoff (100 ms to
// 10 s) until it succeeds (true) or ctx is done (false).
func (h *claimHandler) storeWithRetry(ctx context.Context, batch []*sarama.ConsumerMessage) bool {
	backoff := 100 * time.Millisecond
	for {
		err := failidx.InsertSealed(ctx, h.ix.Pool, batch, h.ix.MaxValueBytes, h.ix.sealer)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		first := batch[0]
		h.ix.Logger.Warn("index: store dead-letter records; retrying", "topic", first.Topic, "partition", first.Partition,
			"offset", first.Offset, "records", len(batch), "err", err)
		if !pglead.Sleep(ctx, time.Duration(rand.Int64N(int64(backoff)))+time.Millisecond) {
			return false
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

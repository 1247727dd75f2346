package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// queue sits between a claim's Messages channel and the partition's worker. A
// reader goroutine drains Messages into it at once, so the closing of Messages
// (how sarama's cooperative protocol says "this partition is revoked") is seen
// even while the worker is busy with a slow handler. It is bounded in practice:
// above highWater the partition's fetching is paused, below lowWater resumed.
type queue struct {
	mu     sync.Mutex
	items  []*sarama.ConsumerMessage
	notify chan struct{} // 1-buffered: "items may be non-empty"
}

func newQueue() *queue { return &queue{notify: make(chan struct{}, 1)} }

// push appends m and returns the queue's length.
func (q *queue) push(m *sarama.ConsumerMessage) int {
	q.mu.Lock()
	q.items = append(q.items, m)
	n := len(q.items)
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return n
}

// pop returns the oldest message and the length left, waiting for one; it
// returns ok=false as soon as ctx is done, even if messages are queued.
func (q *queue) pop(ctx context.Context) (m *sarama.ConsumerMessage, left int, ok bool) {
	for {
		if ctx.Err() != nil {
			return nil, 0, false
		}
		q.mu.Lock()
		if len(q.items) > 0 {
			m = q.items[0]
			q.items[0] = nil
			q.items = q.items[1:]
			left = len(q.items)
			q.mu.Unlock()
			return m, left, true
		}
		q.mu.Unlock()
		select {
		case <-q.notify:
		case <-ctx.Done():
			return nil, 0, false
		}
	}
}

// tryPop returns the oldest message if one is queued or arrives within wait.
func (q *queue) tryPop(ctx context.Context, wait time.Duration) (m *sarama.ConsumerMessage, left int, ok bool) {
	q.mu.Lock()
	if len(q.items) > 0 {
		m = q.items[0]
		q.items[0] = nil
		q.items = q.items[1:]
		left = len(q.items)
		q.mu.Unlock()
		return m, left, true
	}
	q.mu.Unlock()
	if wait <= 0 {
		return nil, 0, false
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return q.pop(wctx)
}

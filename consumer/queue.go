package consumer

import (
	"context"
	"sync"
	"time"

	"github.com/IBM/sarama"
)

// Back-pressure marks of a partition's queue: fetching is paused when the
// queue holds highWater records or highBytes of keys and values, and resumed
// once it is down to lowWater records and lowBytes. The marks are wide
// apart so that a paused partition has a full fetch's worth of work while
// its next fetch is on the way (narrow marks made idem wait on fetch round
// trips: 1,024/256 records ran the no-op path at 0.4 × raw sarama, these at
// 0.9 ×). The bytes bound keeps large records from queueing gigabytes.
const (
	highWater = 8192
	lowWater  = 2048
	highBytes = 4 << 20
	lowBytes  = 1 << 20
)

// queue sits between a claim's Messages channel and the partition's worker. A
// reader goroutine drains Messages into it at once, so the closing of Messages
// (how sarama's cooperative protocol says "this partition is revoked") is seen
// even while the worker is busy with a slow handler. It is bounded in practice:
// above the high-water marks the partition's fetching is paused, below the
// low-water marks resumed.
type queue struct {
	mu     sync.Mutex
	items  []*sarama.ConsumerMessage
	bytes  int           // keys and values of items
	notify chan struct{} // 1-buffered: "items may be non-empty"
}

func newQueue() *queue { return &queue{notify: make(chan struct{}, 1)} }

func size(m *sarama.ConsumerMessage) int { return len(m.Key) + len(m.Value) }

// push appends ms and reports whether the queue is at or above a high mark.
func (q *queue) push(ms ...*sarama.ConsumerMessage) (full bool) {
	q.mu.Lock()
	q.items = append(q.items, ms...)
	for _, m := range ms {
		q.bytes += size(m)
	}
	full = len(q.items) >= highWater || q.bytes >= highBytes
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
	return full
}

// take removes the oldest message; the caller holds mu and has checked that
// there is one. low reports whether the queue is down to its low marks.
func (q *queue) take() (m *sarama.ConsumerMessage, low bool) {
	m = q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	q.bytes -= size(m)
	return m, len(q.items) <= lowWater && q.bytes <= lowBytes
}

// tryTake removes the oldest message if there is one.
func (q *queue) tryTake() (m *sarama.ConsumerMessage, low, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil, false, false
	}
	m, low = q.take()
	return m, low, true
}

// pop returns the oldest message, waiting for one; it returns ok=false as
// soon as ctx is done, even if messages are queued.
func (q *queue) pop(ctx context.Context) (m *sarama.ConsumerMessage, low, ok bool) {
	for {
		if ctx.Err() != nil {
			return nil, false, false
		}
		if m, low, ok = q.tryTake(); ok {
			return m, low, true
		}
		select {
		case <-q.notify:
		case <-ctx.Done():
			return nil, false, false
		}
	}
}

// tryPop returns the oldest message if one is queued or arrives within wait.
func (q *queue) tryPop(ctx context.Context, wait time.Duration) (m *sarama.ConsumerMessage, low, ok bool) {
	if m, low, ok = q.tryTake(); ok || wait <= 0 {
		return m, low, ok
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return q.pop(wctx)
}

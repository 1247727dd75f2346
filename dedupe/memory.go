package dedupe

import (
	"context"
	"sync"
)

// Memory is a process-local Store for tests, demos and examples. It forgets
// everything when the process exits and is not shared between processes, so
// it gives no protection against redelivery to another member or after a
// restart; never use it in production.
//
// Memory records a key only after fn returns nil, never before: a failed or
// panicking fn leaves the key unrecorded, so redelivery runs fn again (unlike
// Watermill's in-memory deduplicator, which records first and then drops the
// retried message as a duplicate). Calls for the same key are serialised:
// concurrent calls yield one Processed and Duplicate for the rest; a waiting
// call gives up with a *StoreError when its ctx is done. Recorded keys are
// kept forever. Memory is safe for concurrent use; the zero value is not
// usable, use NewMemory.
type Memory struct {
	mu   sync.Mutex
	done map[memKey]struct{}
	// busy holds the keys a call is running fn for; the value is nil until a
	// second call for the key waits, then a channel closed when the first
	// finishes. No allocation per key beyond the done map's entry.
	busy map[memKey]chan struct{}
}

type memKey struct{ group, key string }

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory Store.
func NewMemory() *Memory {
	return &Memory{done: make(map[memKey]struct{}), busy: make(map[memKey]chan struct{})}
}

// Process implements Store. fn runs without a transaction (Tx(ctx) is nil).
func (m *Memory) Process(ctx context.Context, rec Record, fn func(ctx context.Context) error) (Outcome, error) {
	if err := checkRecord(rec); err != nil {
		return 0, err
	}
	k := memKey{rec.Group, rec.Key}
	dup, err := m.acquire(ctx, k)
	switch {
	case err != nil:
		return 0, err
	case dup:
		return Duplicate, nil
	}
	ok := false
	defer func() { m.release(k, ok) }() // also on panic
	if err := fn(ctx); err != nil {
		return 0, err
	}
	ok = true
	return Processed, nil
}

// acquire takes k for the caller, waiting while another call holds it. It
// reports dup when k is already recorded (nothing is then held).
func (m *Memory) acquire(ctx context.Context, k memKey) (dup bool, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return false, &StoreError{Op: "lock", Err: err}
		}
		m.mu.Lock()
		if _, ok := m.done[k]; ok {
			m.mu.Unlock()
			return true, nil
		}
		ch, held := m.busy[k]
		if !held {
			m.busy[k] = nil
			m.mu.Unlock()
			return false, nil
		}
		if ch == nil {
			ch = make(chan struct{})
			m.busy[k] = ch
		}
		m.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false, &StoreError{Op: "lock", Err: ctx.Err()}
		}
	}
}

// release gives k back, recording it when done.
func (m *Memory) release(k memKey, done bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if done {
		m.done[k] = struct{}{}
	}
	if ch := m.busy[k]; ch != nil {
		close(ch)
	}
	delete(m.busy, k)
}

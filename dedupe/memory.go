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
	keys map[memKey]*memEntry
}

type memKey struct{ group, key string }

type memEntry struct {
	lock chan struct{} // capacity 1: holding the token serialises the key
	done bool          // guarded by lock
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory Store.
func NewMemory() *Memory {
	return &Memory{keys: make(map[memKey]*memEntry)}
}

// Process implements Store. fn runs without a transaction (Tx(ctx) is nil).
func (m *Memory) Process(ctx context.Context, rec Record, fn func(ctx context.Context) error) (Outcome, error) {
	if err := checkRecord(rec); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, &StoreError{Op: "lock", Err: err}
	}
	e := m.entry(rec)

	select {
	case e.lock <- struct{}{}:
	case <-ctx.Done():
		return 0, &StoreError{Op: "lock", Err: ctx.Err()}
	}
	defer func() { <-e.lock }() // also on panic

	if e.done {
		return Duplicate, nil
	}
	if err := fn(ctx); err != nil {
		return 0, err
	}
	e.done = true
	return Processed, nil
}

// entry returns rec's key's entry, creating it.
func (m *Memory) entry(rec Record) *memEntry {
	k := memKey{rec.Group, rec.Key}
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.keys[k]
	if !ok {
		e = &memEntry{lock: make(chan struct{}, 1)}
		m.keys[k] = e
	}
	return e
}

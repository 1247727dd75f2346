package dedupe

import (
	"context"
	"hash/maphash"
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
	seeds  [2]maphash.Seed
	shards [memShards]memShard
}

// memShards spreads keys over independently locked shards, so partitions
// working at once rarely wait for each other.
const memShards = 64

type memShard struct {
	mu sync.Mutex
	// keys holds a state per key seen: busy while a call runs fn for it,
	// done once recorded. A key is remembered by a 128-bit hash of (group,
	// key), not its text: no pointers for the garbage collector to scan and
	// about 40 bytes a key. Two different keys collide with probability
	// about n²/2¹²⁹ (10⁻²⁷ for a billion keys).
	keys map[memKey]memState
	// waiters holds, for a busy key another call waits for, a channel closed
	// when the holder finishes.
	waiters map[memKey]chan struct{}
	_       [40]byte // keep shards on separate cache lines
}

type memKey [2]uint64

type memState uint8

const (
	memBusy memState = 1 + iota
	memDone
)

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory Store.
func NewMemory() *Memory {
	m := &Memory{seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}}
	for i := range m.shards {
		m.shards[i].keys = make(map[memKey]memState)
		m.shards[i].waiters = make(map[memKey]chan struct{})
	}
	return m
}

func (m *Memory) shard(k memKey) *memShard { return &m.shards[k[0]%memShards] }

// key hashes (group, key).
func (m *Memory) key(group, key string) memKey {
	type gk struct{ g, k string }
	v := gk{group, key}
	return memKey{maphash.Comparable(m.seeds[0], v), maphash.Comparable(m.seeds[1], v)}
}

// Process implements Store. fn runs without a transaction (Tx(ctx) is nil).
func (m *Memory) Process(ctx context.Context, rec Record, fn func(ctx context.Context) error) (Outcome, error) {
	if err := checkRecord(rec); err != nil {
		return 0, err
	}
	k := m.key(rec.Group, rec.Key)
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
	sh := m.shard(k)
	for {
		if err := ctx.Err(); err != nil {
			return false, &StoreError{Op: "lock", Err: err}
		}
		sh.mu.Lock()
		switch sh.keys[k] {
		case memDone:
			sh.mu.Unlock()
			return true, nil
		case 0:
			sh.keys[k] = memBusy
			sh.mu.Unlock()
			return false, nil
		}
		ch := sh.waiters[k]
		if ch == nil {
			ch = make(chan struct{})
			sh.waiters[k] = ch
		}
		sh.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false, &StoreError{Op: "lock", Err: ctx.Err()}
		}
	}
}

// release gives k back, recording it when done.
func (m *Memory) release(k memKey, done bool) {
	sh := m.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if done {
		sh.keys[k] = memDone
	} else {
		delete(sh.keys, k)
	}
	if len(sh.waiters) > 0 {
		if ch := sh.waiters[k]; ch != nil {
			close(ch)
			delete(sh.waiters, k)
		}
	}
}

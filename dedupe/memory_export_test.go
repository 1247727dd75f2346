package dedupe

import (
	"fmt"
	"time"
)

// A MemoryOption changes the window of a Memory the tests build; NewMemory
// has the one window Memory documents.
type MemoryOption func(*memConfig)

// WithMaxKeys sets the count bound (≤ 0: none).
func WithMaxKeys(n int) MemoryOption { return func(c *memConfig) { c.maxKeys = n } }

// WithMaxAge sets the age bound (≤ 0: none).
func WithMaxAge(d time.Duration) MemoryOption { return func(c *memConfig) { c.maxAge = d } }

// NewMemoryWindow is NewMemory with another window.
func NewMemoryWindow(opts ...MemoryOption) *Memory { return NewMemoryWithClock(nil, opts...) }

// NewMemoryWithClock is NewMemoryWindow reading time from clock, for tests
// of the age bound.
func NewMemoryWithClock(clock func() time.Time, opts ...MemoryOption) *Memory {
	c := memDefaults()
	for _, o := range opts {
		o(&c)
	}
	c.clock = clock
	return newMemory(c)
}

// MemoryDefaults returns Memory's default bounds.
func MemoryDefaults() (maxKeys int, maxAge time.Duration) {
	c := memDefaults()
	return c.maxKeys, c.maxAge
}

// Shards returns how many shards m has.
func (m *Memory) Shards() int { return len(m.shards) }

// CheckWindow checks m's invariants while no call is running and returns
// how many keys it remembers: every key is recorded (none busy), each is
// listed once in its shard's order with non-decreasing stamps, and no shard
// exceeds its count bound.
func (m *Memory) CheckWindow() (recorded int, err error) {
	for i := range m.shards {
		n, err := m.shards[i].check(m.perShard)
		if err != nil {
			return 0, fmt.Errorf("shard %d: %w", i, err)
		}
		recorded += n
	}
	return recorded, nil
}

func (sh *memShard) check(bound int) (int, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := sh.order.n
	seen := make(map[memKey]bool, n)
	last := int64(-1 << 63)
	for j := range n {
		e := sh.order.buf[(sh.order.head+j)&(len(sh.order.buf)-1)]
		if _, st := sh.keys.find(e.k); seen[e.k] || st != memDone {
			return 0, fmt.Errorf("key %x listed twice or not recorded (state %d)", e.k, st)
		}
		if e.at < last {
			return 0, fmt.Errorf("stamp %d after %d", e.at, last)
		}
		seen[e.k], last = true, e.at
	}
	switch {
	case sh.keys.n != n:
		return 0, fmt.Errorf("%d keys in the table, %d in the order", sh.keys.n, n)
	case bound > 0 && n > bound:
		return 0, fmt.Errorf("%d keys, bound %d", n, bound)
	}
	return n, nil
}

// Remembers reports whether (group, key) is recorded within m's window,
// without recording it.
func (m *Memory) Remembers(group, key string) bool {
	k := m.key(group, key)
	sh := m.shard(k)
	now := m.now()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	m.expire(sh, now)
	_, st := sh.keys.find(k)
	return st == memDone
}

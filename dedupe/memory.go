package dedupe

import (
	"context"
	"hash/maphash"
	"math/bits"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Memory is a process-local Store that remembers a bounded window of keys:
// the last 1,000,000 recorded (its count bound, MaxKeys), and only those
// recorded within the last hour (its age bound, MaxAge). A key that has
// left the window is forgotten, and a later delivery of it runs fn again,
// as if it had never been recorded. Memory is single-process: it forgets
// everything when the process exits and is not shared between processes,
// so it gives no protection against redelivery to another member or after
// a restart. It is meant for tests and demos; a single process may also use
// it as a best-effort filter of duplicates that arrive within the window,
// but only Postgres makes an effect happen once.
//
// Memory records a key only after fn returns nil, never before: a failed or
// panicking fn leaves the key unrecorded, so redelivery runs fn again (unlike
// Watermill's in-memory deduplicator, which records first and then drops the
// retried message as a duplicate). Calls for the same key are serialised:
// concurrent calls yield one Processed and Duplicate for the rest; a waiting
// call gives up with a *StoreError when its ctx is done.
//
// The window is first in, first out by the time a key was recorded: a
// Duplicate does not refresh it. Keys are spread over 64 shards, each with
// its own lock (no global lock) and its own share of MaxKeys, so the count
// bound is approximate: a key is forgotten once its shard holds
// MaxKeys/64 newer keys, that is after about MaxKeys newer keys in all.
// Keys older than MaxAge are never reported as duplicates; their memory is
// reclaimed when their shard next records a key. A key costs 45 to 70 bytes
// (a 128-bit hash of group and key, not their text, in a hash table and in
// a first-in-first-out list), so the window holds at most about 70 MB;
// recording a new key costs no allocation once the window is full.
//
// Memory is safe for concurrent use; the zero value is not usable, use
// NewMemory.
type Memory struct {
	seeds    [4]maphash.Seed
	group    atomic.Pointer[memGroup] // the first group hashed, and its hashes
	shards   []memShard
	mask     uint64           // len(shards)-1, a power of two minus one
	perShard int              // count bound of one shard; 0: none
	maxAge   int64            // ns; 0: none
	clock    func() time.Time // nil: time.Now, read through time.Since
	epoch    time.Time        // clock() at NewMemory; stamps are ns since it
}

// memConfig is Memory's window. The tests build other windows through
// export_test.go; a service has no need to.
type memConfig struct {
	// maxKeys bounds the store by count: it remembers about the maxKeys
	// keys recorded last and forgets older ones (see Memory on how shards
	// make the bound approximate); ≤ 0: no count bound.
	maxKeys int
	// maxAge bounds it by age: a key recorded more than maxAge ago is
	// forgotten, and a later delivery of it runs fn again; ≤ 0: no age
	// bound.
	maxAge time.Duration
	clock  func() time.Time // nil: the monotonic clock
}

// memDefaults is Memory's window, as documented on Memory and NewMemory
// (checked by TestMemoryDocumentedDefaults).
func memDefaults() memConfig {
	return memConfig{maxKeys: 1_000_000, maxAge: time.Hour}
}

// memShards is the most shards a Memory has; memMinPerShard the fewest keys
// a shard's share of MaxKeys may be (smaller bounds use fewer shards).
const (
	memShards      = 64
	memMinPerShard = 1024
)

type memShard struct {
	mu sync.Mutex
	// keys holds every key recorded within the window or being processed.
	keys memTable
	// order lists the recorded keys, oldest first, with their stamps; each
	// recorded key is in it exactly once, and leaves keys when it leaves
	// order. Stamps never decrease along it.
	order memRing
	last  int64 // the last stamp given in this shard
	// waiters holds, for a busy key another call waits for, a channel closed
	// when the holder finishes. Nil until a shard first sees contention.
	waiters map[memKey]chan struct{}
	_       [64]byte // keep shards' hot fields on separate cache lines
}

// memKey is a 128-bit hash of (group, key). Keys are remembered by it, not
// by their text: no pointers for the garbage collector to scan, 16 bytes a
// key. The low two bits of k[1] are always zero, as memTable keeps a key's
// state in them; the remaining 126 bits (120 within one shard, whose keys
// share the bits choosing it) make two different keys collide with
// probability about n²/2¹²¹ (10⁻¹⁸ for a billion keys).
type memKey [2]uint64

type memState uint64

const (
	memBusy memState = 1 + iota // fn is running for the key
	memDone                     // the key is recorded
)

// memStateBits are the bits of k[1] where memTable keeps a key's state.
const memStateBits = 3

// memTable is a hash set of memKey with a state per key: open addressing,
// linear probing, deletion by backward shift, so that it never fills up
// with tombstones the way a Go map does under a first-in-first-out load
// (every probe would then walk long chains). A slot is the key with its
// state in the low bits of k[1]; the zero slot is empty. Its length is a
// power of two, doubled when it is three quarters full.
type memTable struct {
	slots []memKey
	n     int
	sink  uint64 // see touch
}

func (t *memTable) home(k memKey) int { return int(k[1]>>2) & (len(t.slots) - 1) }

// find returns the slot of k and its state, or the empty slot where k would
// go and 0.
func (t *memTable) find(k memKey) (int, memState) {
	if len(t.slots) == 0 {
		return -1, 0
	}
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := t.slots[i]
		switch {
		case s[0] == k[0] && s[1]&^memStateBits == k[1]:
			return i, memState(s[1] & memStateBits)
		case s == memKey{}:
			return i, 0
		}
	}
}

// touch loads the home slot of k (into sink), to bring it into the cache.
func (t *memTable) touch(k memKey) {
	t.sink = t.slots[t.home(k)][0]
}

// add puts k, absent, with state st (not 0) at slot i, the empty slot find
// returned for it.
func (t *memTable) add(i int, k memKey, st memState) {
	if 4*(t.n+1) > 3*len(t.slots) {
		t.grow()
		i, _ = t.find(k)
	}
	t.n++
	t.slots[i] = memKey{k[0], k[1] | uint64(st)}
}

// setAt changes the state of the key at slot i to st (not 0).
func (t *memTable) setAt(i int, st memState) {
	t.slots[i][1] = t.slots[i][1]&^memStateBits | uint64(st)
}

func (t *memTable) grow() {
	old := t.slots
	t.slots = make([]memKey, max(64, 2*len(old)))
	mask := len(t.slots) - 1
	for _, s := range old {
		if s != (memKey{}) {
			i := t.home(s)
			for t.slots[i] != (memKey{}) {
				i = (i + 1) & mask
			}
			t.slots[i] = s
		}
	}
}

// remove deletes k if it is present.
func (t *memTable) remove(k memKey) {
	if i, st := t.find(k); st != 0 {
		t.removeAt(i)
	}
}

// removeAt deletes the key at slot i, moving back the keys after it that
// would otherwise become unreachable (Knuth's algorithm R).
func (t *memTable) removeAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j] != (memKey{}); j = (j + 1) & mask {
		h := t.home(t.slots[j])
		// The key at j may move to the hole at i unless its home lies
		// cyclically in (i, j].
		if (i <= j && (h <= i || h > j)) || (i > j && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = memKey{}
	t.n--
}

// memEntry is one recorded key and its stamp (ns since Memory.epoch).
type memEntry struct {
	k  memKey
	at int64
}

// memRing is a FIFO of memEntry in a circular buffer whose length, a power
// of two, doubles when it is full.
type memRing struct {
	buf  []memEntry
	head int // index of the oldest entry
	n    int
}

func (r *memRing) push(e memEntry) {
	if r.n == len(r.buf) {
		buf := make([]memEntry, max(64, 2*len(r.buf)))
		k := copy(buf, r.buf[r.head:])
		copy(buf[k:], r.buf[:r.head])
		r.buf, r.head = buf, 0
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = e
	r.n++
}

func (r *memRing) oldest() *memEntry { return &r.buf[r.head] }

func (r *memRing) pop() memKey {
	k := r.buf[r.head].k
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return k
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory Store that remembers the keys
// recorded last, within the window Memory describes.
//
// MaxKeys: 1,000,000.
// MaxAge: 1 hour.
func NewMemory() *Memory { return newMemory(memDefaults()) }

func newMemory(c memConfig) *Memory {
	n := memShards
	if c.maxKeys > 0 {
		// The largest power of two ≤ maxKeys/memMinPerShard, within [1, memShards].
		n = 1 << max(0, min(bits.Len(uint(c.maxKeys/memMinPerShard))-1, bits.Len(memShards)-1))
	}
	m := &Memory{
		seeds:  [4]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed(), maphash.MakeSeed(), maphash.MakeSeed()},
		shards: make([]memShard, n),
		mask:   uint64(n - 1),
		maxAge: int64(max(c.maxAge, 0)),
		clock:  c.clock,
	}
	if c.maxKeys > 0 {
		m.perShard = (c.maxKeys + n - 1) / n
	}
	if m.clock == nil {
		m.epoch = time.Now()
	} else {
		m.epoch = m.clock()
	}
	return m
}

func (m *Memory) shard(k memKey) *memShard { return &m.shards[k[0]&m.mask] }

// memGroup is a group with its hashes under seeds 0 and 2.
type memGroup struct {
	name string
	h    [2]uint64
}

// key hashes (group, key): each half is the XOR of independently seeded
// hashes of the group and of the key. A consumer has one group, so the
// group's hashes are kept for the first group seen (one allocation in the
// store's life): a key then costs two maphash.String calls, not four.
// maphash.String allocates nothing.
func (m *Memory) key(group, key string) memKey {
	var g [2]uint64
	if p := m.group.Load(); p != nil && p.name == group {
		g = p.h
	} else {
		g = [2]uint64{maphash.String(m.seeds[0], group), maphash.String(m.seeds[2], group)}
		if p == nil {
			m.group.CompareAndSwap(nil, &memGroup{name: strings.Clone(group), h: g})
		}
	}
	return memKey{
		g[0] ^ maphash.String(m.seeds[1], key),
		(g[1] ^ maphash.String(m.seeds[3], key)) &^ memStateBits,
	}
}

// now is the time in ns since m.epoch, or 0 when nothing needs it (no age
// bound). The default clock reads only the monotonic clock.
func (m *Memory) now() int64 {
	switch {
	case m.maxAge == 0:
		return 0
	case m.clock == nil:
		return int64(time.Since(m.epoch))
	}
	return int64(m.clock().Sub(m.epoch))
}

// Process implements Store. fn runs without a store transaction: ctx carries
// none.
func (m *Memory) Process(ctx context.Context, rec Record, fn func(ctx context.Context) error) (Outcome, error) {
	// stored's checks and key, without its copy of rec: only the group and
	// the inbox key are needed.
	if err := checkRecord(rec); err != nil {
		return 0, err
	}
	k := m.key(rec.Group, rec.InboxKey())
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
// reports dup when k is recorded within the window (nothing is then held).
// A key not in the table needs no clock: only a recorded one is checked
// against the age bound.
func (m *Memory) acquire(ctx context.Context, k memKey) (dup bool, err error) {
	sh := m.shard(k)
	for {
		if err := ctx.Err(); err != nil {
			return false, &StoreError{Op: "lock", Err: err}
		}
		sh.mu.Lock()
		if m.perShard > 0 && sh.order.n >= m.perShard {
			// Recording k will evict the oldest key: load its slot now, so
			// that its cache miss overlaps k's instead of following it.
			sh.keys.touch(sh.order.oldest().k)
		}
		i, st := sh.keys.find(k)
		if st == memDone && m.maxAge > 0 {
			m.expire(sh, m.now()) // k leaves if it is too old
			i, st = sh.keys.find(k)
		}
		switch st {
		case memDone:
			sh.mu.Unlock()
			return true, nil
		case 0:
			sh.keys.add(i, k, memBusy)
			sh.mu.Unlock()
			return false, nil
		}
		if sh.waiters == nil {
			sh.waiters = make(map[memKey]chan struct{})
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

// release gives k back, recording it when done: first the keys past the
// age bound leave, then the oldest if the shard is full.
func (m *Memory) release(k memKey, done bool) {
	sh := m.shard(k)
	now := int64(0)
	if done {
		now = m.now()
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i, _ := sh.keys.find(k) // busy: acquire added it
	if done {
		sh.keys.setAt(i, memDone)
		now = max(now, sh.last) // stamps never decrease along order
		sh.last = now
		m.expire(sh, now)
		if m.perShard > 0 && sh.order.n >= m.perShard {
			sh.keys.remove(sh.order.pop())
		}
		sh.order.push(memEntry{k: k, at: now})
	} else {
		sh.keys.removeAt(i)
	}
	if len(sh.waiters) > 0 {
		if ch := sh.waiters[k]; ch != nil {
			close(ch)
			delete(sh.waiters, k)
		}
	}
}

// expire forgets sh's keys recorded more than m.maxAge before now. The caller
// holds sh.mu.
func (m *Memory) expire(sh *memShard, now int64) {
	if m.maxAge == 0 {
		return
	}
	for sh.order.n > 0 && now-sh.order.oldest().at > m.maxAge {
		sh.keys.remove(sh.order.pop())
	}
}

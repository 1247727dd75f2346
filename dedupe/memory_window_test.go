package dedupe_test

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/dedupe/dedupetest"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// TestMemoryWindowConformance runs the conformance suite over windows of
// every shape: one shard and a tiny count bound, age only, both, neither.
func TestMemoryWindowConformance(t *testing.T) {
	for name, opts := range map[string][]dedupe.MemoryOption{
		"count-8":         {dedupe.WithMaxKeys(8), dedupe.WithMaxAge(0)},
		"age-only":        {dedupe.WithMaxKeys(0), dedupe.WithMaxAge(time.Minute)},
		"count-and-age":   {dedupe.WithMaxKeys(100_000), dedupe.WithMaxAge(time.Minute)},
		"unbounded":       {dedupe.WithMaxKeys(0), dedupe.WithMaxAge(0)},
		"negative-is-off": {dedupe.WithMaxKeys(-1), dedupe.WithMaxAge(-time.Second)},
	} {
		t.Run(name, func(t *testing.T) {
			dedupetest.Run(t, func(t *testing.T) dedupe.Store { return dedupe.NewMemoryWindow(opts...) })
		})
	}
}

// A redelivery within the window (the last 1,000,000 keys, the last hour)
// is a Duplicate.
func ExampleNewMemory() {
	store := dedupe.NewMemory()
	rec := dedupe.Record{Group: "payments", Key: "pay-42"}
	for range 2 {
		out, err := store.Process(context.Background(), rec, func(context.Context) error {
			fmt.Println("charging pay-42")
			return nil
		})
		fmt.Println(out, err)
	}
	// Output:
	// charging pay-42
	// processed <nil>
	// duplicate <nil>
}

// mustProcess calls s.Process with a no-op fn and checks the outcome.
func mustProcess(t *testing.T, s dedupe.Store, group, key string, want dedupe.Outcome) {
	t.Helper()
	out, err := s.Process(context.Background(), dedupe.Record{Group: group, Key: key}, func(context.Context) error { return nil })
	if err != nil || out != want {
		t.Fatalf("Process(%s) = (%v, %v), want %v", key, out, err, want)
	}
}

func checkWindow(t *testing.T, m *dedupe.Memory, want int) {
	t.Helper()
	n, err := m.CheckWindow()
	if err != nil {
		t.Fatal(err)
	}
	if want >= 0 && n != want {
		t.Fatalf("store remembers %d keys, want %d", n, want)
	}
}

// TestMemoryEvictsByCount: below 2,048 keys the store has one shard and
// forgets exactly the oldest key when one more is recorded; a Duplicate
// does not refresh a key (first in, first out).
func TestMemoryEvictsByCount(t *testing.T) {
	m := dedupe.NewMemoryWindow(dedupe.WithMaxKeys(100), dedupe.WithMaxAge(0))
	if m.Shards() != 1 {
		t.Fatalf("%d shards for 100 keys, want 1", m.Shards())
	}
	for i := range 100 {
		mustProcess(t, m, "g", fmt.Sprint("k", i), dedupe.Processed)
	}
	mustProcess(t, m, "g", "k0", dedupe.Duplicate) // does not make k0 the newest
	checkWindow(t, m, 100)
	mustProcess(t, m, "g", "k100", dedupe.Processed) // k0 leaves the window
	checkWindow(t, m, 100)
	if m.Remembers("g", "k0") || !m.Remembers("g", "k1") || !m.Remembers("g", "k100") {
		t.Fatalf("after k100: k0 remembered %v (want false), k1 %v, k100 %v (want true)",
			m.Remembers("g", "k0"), m.Remembers("g", "k1"), m.Remembers("g", "k100"))
	}
	mustProcess(t, m, "g", "k0", dedupe.Processed) // forgotten: runs again, and k1 leaves
	mustProcess(t, m, "g", "k1", dedupe.Processed) // and k2 leaves
	mustProcess(t, m, "g", "k3", dedupe.Duplicate)
	mustProcess(t, m, "g", "k2", dedupe.Processed)
	checkWindow(t, m, 100)

	// A failed fn does not enter the window, so it evicts nothing.
	boom := errors.New("boom")
	for i := range 10 {
		_, err := m.Process(context.Background(), dedupe.Record{Group: "g", Key: fmt.Sprint("fail", i)}, func(context.Context) error { return boom })
		if !errors.Is(err, boom) {
			t.Fatalf("failing fn: err %v", err)
		}
	}
	checkWindow(t, m, 100)
	mustProcess(t, m, "g", "k4", dedupe.Duplicate)
}

// TestMemoryEvictsByCountSharded: with 64 shards each keeps its share of
// MaxKeys, so the newest keys are all remembered and the oldest forgotten,
// the store never holds more than MaxKeys, and the point where a key leaves
// varies a little around MaxKeys (per-shard counts are binomial).
func TestMemoryEvictsByCountSharded(t *testing.T) {
	const maxKeys, total = 64 * 1024, 200_000
	m := dedupe.NewMemoryWindow(dedupe.WithMaxKeys(maxKeys), dedupe.WithMaxAge(0))
	if m.Shards() != 64 {
		t.Fatalf("%d shards, want 64", m.Shards())
	}
	for i := range total {
		mustProcess(t, m, "g", strconv.Itoa(i), dedupe.Processed)
	}
	checkWindow(t, m, maxKeys) // every shard got far more than its 1,024 keys: each is full
	// A shard's share of the last 50,000 keys is 781 ± 28: under 1,024 by far.
	for i := total - 50_000; i < total; i++ {
		if !m.Remembers("g", strconv.Itoa(i)) {
			t.Fatalf("key %d, one of the newest 50,000, is forgotten", i)
		}
	}
	// A shard's share of the last 80,000 is 1,250 ± 35: over 1,024 by far.
	for i := range total - 80_000 {
		if m.Remembers("g", strconv.Itoa(i)) {
			t.Fatalf("key %d, older than the newest 80,000, is remembered", i)
		}
	}
}

// TestMemoryEvictsByAge: a key is remembered for MaxAge after its fn
// returned (not after it started), MaxAge included, and forgotten once
// older; forgotten keys give their memory back.
func TestMemoryEvictsByAge(t *testing.T) {
	clock := newFakeClock()
	start := clock.Now()
	at := func(d time.Duration) { clock.Advance(start.Add(d).Sub(clock.Now())) }
	m := dedupe.NewMemoryWithClock(clock.Now, dedupe.WithMaxKeys(1000), dedupe.WithMaxAge(time.Minute))
	mustProcess(t, m, "g", "a", dedupe.Processed) // recorded at 0
	at(30 * time.Second)
	out, err := m.Process(context.Background(), dedupe.Record{Group: "g", Key: "b"}, func(context.Context) error {
		at(80 * time.Second) // b's fn takes 50 s: b is recorded at 80 s
		return nil
	})
	if err != nil || out != dedupe.Processed {
		t.Fatalf("b: (%v, %v)", out, err)
	}
	if m.Remembers("g", "a") {
		t.Fatal("a is remembered 80 s after it was recorded, window 1 m")
	}
	at(91 * time.Second) // 61 s after b started, 11 s after it succeeded
	mustProcess(t, m, "g", "b", dedupe.Duplicate)
	at(140 * time.Second) // b exactly one minute old: still in the window
	mustProcess(t, m, "g", "b", dedupe.Duplicate)
	at(140*time.Second + time.Nanosecond)
	mustProcess(t, m, "g", "b", dedupe.Processed) // forgotten: runs again, recorded anew
	at(200 * time.Second)
	mustProcess(t, m, "g", "b", dedupe.Duplicate)
	checkWindow(t, m, 1)

	for i := range 500 {
		mustProcess(t, m, "g", fmt.Sprint("k", i), dedupe.Processed)
	}
	checkWindow(t, m, 501)
	at(time.Hour)
	mustProcess(t, m, "g", "late", dedupe.Processed) // expires the shard's old keys
	checkWindow(t, m, 1)
	mustProcess(t, m, "g", "k0", dedupe.Processed)
}

// TestMemoryBatchWindow: ProcessBatch records its keys into the same
// window: a batch larger than the window leaves only MaxKeys of them, and
// the evicted ones run again in the next batch.
func TestMemoryBatchWindow(t *testing.T) {
	m := dedupe.NewMemoryWindow(dedupe.WithMaxKeys(4), dedupe.WithMaxAge(0))
	var recs []dedupe.Record
	for i := range 6 {
		recs = append(recs, dedupe.Record{Group: "g", Key: fmt.Sprint("k", i)})
	}
	batch := func() []int {
		var got []int
		if _, err := m.ProcessBatch(context.Background(), recs, func(_ context.Context, fresh []int) error {
			got = fresh
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := batch(); len(got) != 6 {
		t.Fatalf("first batch ran %v, want all 6", got)
	}
	checkWindow(t, m, 4)
	if got := batch(); len(got) != 2 {
		t.Fatalf("second batch ran %v, want the 2 keys the window of 4 forgot", got)
	}
	checkWindow(t, m, 4)
}

// TestMemoryWindowModel checks one shard against a plain first-in-first-out
// list over many recordings, failures and redeliveries of a few hundred
// keys, so that the table's rebuilds, its stale keys and its deletions all
// happen many times.
func TestMemoryWindowModel(t *testing.T) {
	for _, window := range []int{8, 100, 1000} {
		t.Run(strconv.Itoa(window), func(t *testing.T) {
			m := dedupe.NewMemoryWindow(dedupe.WithMaxKeys(window), dedupe.WithMaxAge(0))
			rng := rand.New(rand.NewPCG(1, uint64(window)))
			var fifo []string
			in := map[string]bool{}
			boom := errors.New("boom")
			for i := range 200 * window {
				key := strconv.Itoa(rng.IntN(3 * window))
				fail := rng.IntN(10) == 0
				out, err := m.Process(context.Background(), dedupe.Record{Group: "g", Key: key}, func(context.Context) error {
					if fail {
						return boom
					}
					return nil
				})
				switch {
				case in[key]:
					if err != nil || out != dedupe.Duplicate {
						t.Fatalf("call %d, key %s in the window: (%v, %v), want duplicate", i, key, out, err)
					}
				case fail:
					if !errors.Is(err, boom) {
						t.Fatalf("call %d, key %s, failing fn: (%v, %v)", i, key, out, err)
					}
				default:
					if err != nil || out != dedupe.Processed {
						t.Fatalf("call %d, key %s not in the window: (%v, %v), want processed", i, key, out, err)
					}
					if len(fifo) == window {
						delete(in, fifo[0])
						fifo = fifo[1:]
					}
					fifo = append(fifo, key)
					in[key] = true
				}
				if i%(window/2) == 0 {
					checkWindow(t, m, len(fifo))
				}
			}
			checkWindow(t, m, len(fifo))
		})
	}
}

// TestMemoryWindowConcurrent hammers a small window from many goroutines
// over overlapping keys (run it with -race): every call ends Processed or
// Duplicate, no key runs twice while it is in the window, and the shards'
// bookkeeping holds afterwards.
func TestMemoryWindowConcurrent(t *testing.T) {
	clock := newFakeClock()
	m := dedupe.NewMemoryWithClock(clock.Now, dedupe.WithMaxKeys(4096), dedupe.WithMaxAge(time.Second))
	var running sync.Map
	var wg sync.WaitGroup
	var errs atomic.Int32
	for w := range 8 {
		wg.Go(func() {
			for i := range 5000 {
				key := strconv.Itoa((i*7 + w*13) % 6000)
				if i%100 == 0 {
					clock.Advance(10 * time.Millisecond)
				}
				_, err := m.Process(context.Background(), dedupe.Record{Group: "g", Key: key}, func(context.Context) error {
					if _, dup := running.LoadOrStore(key, true); dup {
						errs.Add(1) // two calls of one key at once
					}
					defer running.Delete(key)
					if i%50 == 0 {
						return errors.New("fail now and then")
					}
					return nil
				})
				if err != nil && err.Error() != "fail now and then" {
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if errs.Load() != 0 {
		t.Fatalf("%d calls ran a key concurrently or failed unexpectedly", errs.Load())
	}
	checkWindow(t, m, -1)
}

// TestMemoryDocumentedDefaults: NewMemory's doc, and Memory's, state
// memDefaults' window.
func TestMemoryDocumentedDefaults(t *testing.T) {
	maxKeys, maxAge := dedupe.MemoryDefaults()
	f, err := parser.ParseFile(token.NewFileSet(), "memory.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]string{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Doc != nil {
				docs[d.Name.Name] = d.Doc.Text()
			}
		case *ast.GenDecl:
			if ts, ok := d.Specs[0].(*ast.TypeSpec); ok && d.Doc != nil {
				docs[ts.Name.Name] = d.Doc.Text()
			}
		}
	}
	if maxAge%time.Hour != 0 {
		t.Fatalf("default MaxAge %v: teach this test to spell it", maxAge)
	}
	for _, want := range []string{"MaxKeys: " + commas(maxKeys) + ".", "MaxAge: " + plural(int(maxAge/time.Hour), "hour") + "."} {
		if !strings.Contains(docs["NewMemory"], want) {
			t.Errorf("NewMemory's doc lacks %q:\n%s", want, docs["NewMemory"])
		}
	}
	for _, want := range []string{"the last " + commas(maxKeys) + " recorded", "the last " + strings.TrimPrefix(plural(int(maxAge/time.Hour), "hour"), "1 ")} {
		if !strings.Contains(strings.Join(strings.Fields(docs["Memory"]), " "), want) {
			t.Errorf("Memory's doc lacks %q:\n%s", want, docs["Memory"])
		}
	}
}

func commas(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

func plural(n int, unit string) string {
	if n == 1 {
		return "1 " + unit
	}
	return strconv.Itoa(n) + " " + unit + "s"
}

// BenchmarkMemoryProcess measures Process with a no-op fn: "new" records a
// fresh key each time (the consumer's no-op path; past 1,000,000 keys each
// call also evicts one), "duplicate" finds a recorded key, and "parallel"
// is "new" from GOMAXPROCS goroutines.
func BenchmarkMemoryProcess(b *testing.B) {
	ctx := context.Background()
	noop := func(context.Context) error { return nil }
	b.Run("new", func(b *testing.B) {
		m := dedupe.NewMemory()
		k := newKeyGen("")
		b.ReportAllocs()
		for b.Loop() {
			if out, err := m.Process(ctx, dedupe.Record{Group: "bench-group", Key: k.next()}, noop); out != dedupe.Processed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("duplicate", func(b *testing.B) {
		m := dedupe.NewMemory()
		rec := dedupe.Record{Group: "bench-group", Key: "orders/3/12345"}
		if _, err := m.Process(ctx, rec, noop); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if out, err := m.Process(ctx, rec, noop); out != dedupe.Duplicate {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		m := dedupe.NewMemory()
		var id atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			k := newKeyGen(strconv.FormatInt(id.Add(1), 10) + "/")
			for pb.Next() {
				if out, err := m.Process(ctx, dedupe.Record{Group: "bench-group", Key: k.next()}, noop); out != dedupe.Processed {
					b.Error(out, err)
					return
				}
			}
		})
	})
}

// keyGen makes unique keys like the bench's "topic/partition/offset" without
// allocating: the key's bytes are rewritten in place for each call, which is
// safe because Memory keeps a hash of the key, never the string.
type keyGen struct {
	buf    []byte
	digits int // where the counter's digits start
	n      uint64
}

func newKeyGen(prefix string) *keyGen {
	g := &keyGen{buf: []byte("idem-bench-data/7/" + prefix + "0000000000000000")}
	g.digits = len(g.buf) - 16
	return g
}

func (g *keyGen) next() string {
	g.n++
	v := g.n
	for i := len(g.buf) - 1; i >= g.digits; i-- {
		g.buf[i] = byte('0' + v%10)
		v /= 10
	}
	return unsafe.String(&g.buf[0], len(g.buf))
}

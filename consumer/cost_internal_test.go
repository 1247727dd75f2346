package consumer

import (
	"context"
	"log/slog"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/correlation"
	"github.com/idemhq/idem/internal/tables"
)

// costSession and costClaim are the sarama session and claim of
// BenchmarkRecordToMark: a mark goes nowhere, as the benchmark measures
// idem's side of it.
type costSession struct {
	sarama.ConsumerGroupSession
	ctx   context.Context
	marks int64
}

func (s *costSession) MarkOffset(string, int32, int64, string) { s.marks++ }
func (s *costSession) Context() context.Context                { return s.ctx }

type costClaim struct{ sarama.ConsumerGroupClaim }

func (costClaim) Topic() string    { return "t" }
func (costClaim) Partition() int32 { return 0 }

// newCostClaim returns a claim of a runner as Run builds it, with the
// memory dedupe store, a no-op handler, a real registry, no tracing SDK and
// no Kafka (sess counts the marks).
func newCostClaim(tb testing.TB) (*claim, *costSession) {
	tb.Helper()
	h := handler.Func(func(context.Context, *handler.Message) error { return nil })
	cfg, _ := forHandler(Config{
		Brokers: []string{"127.0.0.1:9"}, Group: "g", Topics: []string{"t"},
		Dedupe: dedupe.NewMemory(), Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
	}, h)
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	r, err := newRunner(cfg.withDefaults(), h)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := tb.Context()
	r.baseCtx, r.runCtx = ctx, ctx
	r.gate = newGate(r)
	sess := &costSession{ctx: ctx}
	return newClaim(r, sess, costClaim{}), sess
}

// A worker's handler ctx carries the correlation slot (correlate fills it
// per call, so a call makes no context of its own) and the step scope.
func TestWorkerCtxHasCorrelationSlot(t *testing.T) {
	c, _ := newCostClaim(t)
	for _, w := range append([]*worker{c.main}, c.workers...) {
		if correlation.SlotOf(w.ob.hctx) == nil {
			t.Fatal("the worker's handler ctx has no correlation slot")
		}
		if tables.StepScopeOf(w.ob.hctx) != &w.steps {
			t.Fatal("the worker's handler ctx has not its step scope")
		}
	}
}

// The no-op path allocates one object a record, the key's string (HeaderKey
// returns a string of its own), and nothing else: no Message (a processed
// record's is reused), no context, no deferral id. A change that adds one
// fails here; BenchmarkRecordToMark gives the figures.
func TestRecordToMarkAllocs(t *testing.T) {
	c, sess := newCostClaim(t)
	ts := time.Now()
	var n int64
	rec := func() *sarama.ConsumerMessage {
		n++
		return &sarama.ConsumerMessage{Topic: "t", Offset: n, Timestamp: ts, Value: []byte("v"),
			Headers: []*sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("k" + strconv.FormatInt(n, 10))}}}
	}
	var ms []*sarama.ConsumerMessage
	for range 200 {
		ms = append(ms, rec())
	}
	if err := c.main.handle(rec()); err != nil { // the first record: the spare Message, the caches
		t.Fatal(err)
	}
	i := 0
	allocs := testing.AllocsPerRun(len(ms)-1, func() {
		if err := c.main.handle(ms[i]); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs > 1 {
		t.Fatalf("%.1f allocations a record on the no-op path, want at most 1 (the key)", allocs)
	}
	if sess.marks != int64(len(ms)+1) {
		t.Fatalf("%d marks, want %d", sess.marks, len(ms)+1)
	}
}

// BenchmarkRecordToMark is idem's own cost of a record on the no-op path,
// from the fetched record (a *sarama.ConsumerMessage, as sarama hands it
// over) to its mark: the partition's queue, the worker's steps, the key from
// the idempotency-key header, the memory dedupe store, a handler that does
// nothing, the metrics (a real registry) and tracing (no SDK), and the mark.
// No Kafka: records are queued in bursts of readBurst as the claim's reader
// queues them, with a fresh key each. allocs/op is the allocations a record;
// the goal is 0. cpu-ns/op is the process's CPU time a record (user and
// system, the garbage collector's included): on a shared machine it moves
// less than ns/op, which counts the time other processes had the cores.
//
//	go test -run '^$' -bench RecordToMark -benchmem ./consumer/
func BenchmarkRecordToMark(b *testing.B) {
	c, sess := newCostClaim(b)
	ctx := b.Context()
	q := newQueue()
	src := queueSource{c, q}

	// One burst of records, reused: a fresh key (16 digits, rewritten in
	// place) and offset each time round.
	ms := make([]*sarama.ConsumerMessage, readBurst)
	for i := range ms {
		ms[i] = &sarama.ConsumerMessage{
			Topic: "t", Value: []byte(`{"n":1}`), Key: []byte("k"), Timestamp: time.Now(),
			Headers: []*sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: make([]byte, 16)}},
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for i := 0; i < b.N; {
		n := min(readBurst, b.N-i)
		for j, m := range ms[:n] {
			m.Offset = int64(i + j)
			v, o := m.Headers[0].Value, m.Offset
			for k := len(v) - 1; k > 0; k-- {
				v[k] = byte('0' + o%10)
				o /= 10
			}
			v[0] = 'k'
		}
		q.push(ms[:n]...)
		for range n {
			m, ok := src.pop(ctx)
			if !ok {
				b.Fatal("queue stopped")
			}
			if err := c.main.handle(m); err != nil {
				b.Fatal(err)
			}
		}
		i += n
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
	if sess.marks != int64(b.N) {
		b.Fatalf("%d marks, want %d", sess.marks, b.N)
	}
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

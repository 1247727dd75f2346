package main

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
)

// phases records, in the latency run of a Breakdown scenario, when each
// record passed the points of idem's batch path that can be seen from
// outside the consumer, through its public hooks only:
//
//   - produced: the record's timestamp (the parent stamps it when it hands
//     the record to its producer; Kafka keeps milliseconds);
//   - fetched: sarama hands it to the consumer (a sarama ConsumerInterceptor,
//     called just before the record goes into sarama's channel);
//   - taken: idem's worker takes it from the partition's queue into a batch
//     (the KeyFunc, which the worker calls on each record as it takes it);
//   - the batch starts: the store's ProcessBatch is called (BEGIN and the
//     inbox INSERT follow);
//   - its handler starts and ends: the function ProcessBatch runs;
//   - committed: ProcessBatch returns, the COMMIT done.
//
// The handler of the scenario adds each record's own statement (own). The
// phases between these points add up to produced → committed, the latency
// the meter reports. The mark of the offsets follows the COMMIT inside the
// consumer, unseen; its bound is the time from a batch's COMMIT to the
// worker taking the partition's next record, when that record was already
// fetched (so the worker did nothing else in between: the marks, then one
// pop). Safe for concurrent use.
type phases struct {
	now func() time.Time

	mu   sync.Mutex
	recs map[string]*recTimes // by idempotency key
	// done holds, per partition, the last batch's COMMIT until the worker
	// takes the partition's next record; marks the bounds measured.
	done  map[int32]int64
	marks []time.Duration
}

// recTimes are one record's points, unix ns (0: not seen).
type recTimes struct {
	ts, fetched, taken int64
	ownStart, ownEnd   int64
	batch              *batchTimes
}

// batchTimes are one batch's points, unix ns.
type batchTimes struct {
	start, handlerStart, handlerEnd, committed int64
	partition                                  int32
}

func newPhases() *phases {
	return &phases{now: time.Now, recs: map[string]*recTimes{}, done: map[int32]int64{}}
}

func (p *phases) stamp() int64 { return p.now().UnixNano() }

// rec returns key's times, made on first use; p.mu is held.
func (p *phases) rec(key string) *recTimes {
	r := p.recs[key]
	if r == nil {
		r = &recTimes{}
		p.recs[key] = r
	}
	return r
}

// OnConsume implements sarama.ConsumerInterceptor: m is fetched.
func (p *phases) OnConsume(m *sarama.ConsumerMessage) {
	now, key := p.stamp(), headerKey(m)
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.rec(key); r.fetched == 0 { // a record fetched again after a rebalance keeps its first time
		r.ts, r.fetched = m.Timestamp.UnixNano(), now
	}
}

// keyFunc wraps f, the scenario's KeyFunc, to note when the worker takes
// each record.
func (p *phases) keyFunc(f consumer.KeyFunc) consumer.KeyFunc {
	return func(m *handler.Message) (string, error) {
		k, err := f(m)
		if err == nil {
			p.taken(k, m.Partition)
		}
		return k, err
	}
}

// taken notes that the worker of partition took key's record.
func (p *phases) taken(key string, partition int32) {
	now := p.stamp()
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rec(key)
	if r.taken != 0 {
		return // handled again alone, after a failed batch
	}
	r.taken = now
	if d, ok := p.done[partition]; ok {
		delete(p.done, partition)
		if r.fetched != 0 && r.fetched < d { // it was waiting: the gap is the marks and one pop
			p.marks = append(p.marks, time.Duration(now-d))
		}
	}
}

// own notes the span of key's own statement inside its batch's handler.
func (p *phases) own(key string, start, end time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rec(key)
	r.ownStart, r.ownEnd = start.UnixNano(), end.UnixNano()
}

// batch starts a batch's times and wraps the function its store runs, to
// note the handler's start and end.
func (p *phases) batch(fn func(context.Context, []int) error) (*batchTimes, func(context.Context, []int) error) {
	b := &batchTimes{start: p.stamp()}
	return b, func(ctx context.Context, fresh []int) error {
		b.handlerStart = p.stamp()
		defer func() { b.handlerEnd = p.stamp() }()
		return fn(ctx, fresh)
	}
}

// committed notes that b, the batch of recs, committed.
func (p *phases) committed(b *batchTimes, recs []dedupe.Record) {
	b.committed = p.stamp()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, rec := range recs {
		p.rec(rec.Key).batch = b
	}
	if len(recs) > 0 {
		b.partition = recs[0].Partition
		p.done[b.partition] = b.committed
	}
}

// breakdown is where the records of a latency run spent their time, phase
// by phase (the report's table and its JSON).
type breakdown struct {
	// Records counts the records with every point seen, the warm-up left
	// out (records handled alone, after a failed batch, are not counted).
	Records int `json:"records"`
	// Batches and MeanBatch: the batches those records were in.
	Batches   int     `json:"batches"`
	MeanBatch float64 `json:"mean_batch_size"`
	// Busy is the share of the time the partitions' workers spent in those
	// batches (start to COMMIT), from the first batch's start to the last
	// COMMIT: a worker near 1 leaves its partition's records queueing.
	Busy float64 `json:"worker_busy"`
	// Phases in path order, then own (a part of handler) and total
	// (produced → committed, the sum of the others but own).
	Phases []phaseStat `json:"phases"`
	// Mark: the bound of the marks after a COMMIT (see phases), over the
	// batches where it could be measured.
	MarkBatches int     `json:"mark_batches"`
	MarkP50ms   float64 `json:"mark_p50_ms"`
	MarkP99ms   float64 `json:"mark_p99_ms"`
}

// phaseStat is one phase's time over the records, and over the tail: the
// records whose total is at or above the total's p99.
type phaseStat struct {
	Name   string  `json:"name"`
	What   string  `json:"what"`
	MeanMs float64 `json:"mean_ms"`
	P50ms  float64 `json:"p50_ms"`
	P99ms  float64 `json:"p99_ms"`
	// TailMeanMs is the phase's mean over the tail, and TailShare that
	// mean over the tail's mean total: the phases' shares add up to 1.
	TailMeanMs float64 `json:"tail_mean_ms"`
	TailShare  float64 `json:"tail_share"`
}

// phaseDefs are the phases, each the time between two points.
var phaseDefs = []struct {
	name, what string
	d          func(r *recTimes) int64
}{
	{"kafka", "produced → fetched: the producer's linger, the broker, the fetch", func(r *recTimes) int64 { return r.fetched - r.ts }},
	{"queue", "fetched → taken by the worker: waiting behind the partition's earlier batches", func(r *recTimes) int64 { return r.taken - r.fetched }},
	{"gather", "taken → the batch starts: the batch filling (MaxMessages, MaxWait, MaxLatency)", func(r *recTimes) int64 { return r.batch.start - r.taken }},
	{"begin", "the batch starts → its handler starts: BEGIN and the inbox INSERT", func(r *recTimes) int64 { return r.batch.handlerStart - r.batch.start }},
	{"handler", "the batch's handler: every record's INSERT, one round trip each", func(r *recTimes) int64 { return r.batch.handlerEnd - r.batch.handlerStart }},
	{"commit", "the handler returned → COMMIT returned", func(r *recTimes) int64 { return r.batch.committed - r.batch.handlerEnd }},
}

// result computes the breakdown of the records stamped warmup or more after
// the first one (the meter leaves the same ones out).
func (p *phases) result(warmup time.Duration) *breakdown {
	p.mu.Lock()
	defer p.mu.Unlock()
	var rs []*recTimes
	first := int64(0)
	for _, r := range p.recs {
		if r.ts > 0 && (first == 0 || r.ts < first) {
			first = r.ts
		}
	}
	batches := map[*batchTimes]bool{}
	for _, r := range p.recs {
		if r.ts >= first+int64(warmup) && r.fetched != 0 && r.taken != 0 && r.batch != nil && r.batch.handlerStart != 0 {
			rs = append(rs, r)
			batches[r.batch] = true
		}
	}
	if len(rs) == 0 {
		return nil
	}
	total := func(r *recTimes) int64 { return r.batch.committed - r.ts }
	slices.SortFunc(rs, func(a, b *recTimes) int { return cmp.Compare(total(a), total(b)) })
	tail := rs[max(0, min(len(rs)-1, int(0.99*float64(len(rs))+0.5)-1)):] // from the p99 up (quantile's index)
	var tailTotal float64
	for _, r := range tail {
		tailTotal += float64(total(r))
	}
	tailTotal /= float64(len(tail))
	stat := func(name, what string, d func(*recTimes) int64, of []*recTimes) phaseStat {
		l := make([]time.Duration, 0, len(of))
		var all float64
		for _, r := range of {
			l = append(l, time.Duration(max(0, d(r))))
			all += float64(l[len(l)-1])
		}
		slices.Sort(l)
		var sum float64
		for _, r := range tail {
			sum += float64(max(0, d(r)))
		}
		s := phaseStat{Name: name, What: what, MeanMs: all / float64(len(l)) / 1e6, P50ms: ms(quantile(l, 0.5)), P99ms: ms(quantile(l, 0.99)),
			TailMeanMs: sum / float64(len(tail)) / 1e6}
		if tailTotal > 0 {
			s.TailShare = sum / float64(len(tail)) / tailTotal
		}
		return s
	}
	b := &breakdown{Records: len(rs), Batches: len(batches), MeanBatch: float64(len(rs)) / float64(len(batches)), Busy: busy(batches)}
	for _, def := range phaseDefs {
		b.Phases = append(b.Phases, stat(def.name, def.what, def.d, rs))
	}
	var owned []*recTimes // records whose handler noted its own statement
	for _, r := range rs {
		if r.ownEnd != 0 {
			owned = append(owned, r)
		}
	}
	if len(owned) > 0 {
		b.Phases = append(b.Phases, stat("own", "the record's own INSERT, a part of handler", func(r *recTimes) int64 {
			if r.ownEnd == 0 {
				return 0
			}
			return r.ownEnd - r.ownStart
		}, owned))
	}
	b.Phases = append(b.Phases, stat("total", "produced → committed (the latency reported)", total, rs))
	if len(p.marks) > 0 {
		m := slices.Clone(p.marks)
		slices.Sort(m)
		b.MarkBatches, b.MarkP50ms, b.MarkP99ms = len(m), ms(quantile(m, 0.5)), ms(quantile(m, 0.99))
	}
	return b
}

// busy is the share of the time the workers of the batches' partitions
// spent in them, from the first start to the last COMMIT.
func busy(batches map[*batchTimes]bool) float64 {
	var in, from, to int64
	parts := map[int32]bool{}
	for b := range batches {
		in += b.committed - b.start
		if from == 0 || b.start < from {
			from = b.start
		}
		to = max(to, b.committed)
		parts[b.partition] = true
	}
	if to <= from {
		return 0
	}
	return float64(in) / float64(to-from) / float64(len(parts))
}

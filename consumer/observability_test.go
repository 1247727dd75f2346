package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// tracing is an SDK tracer provider recording into memory, for one test.
type tracing struct {
	exp *tracetest.InMemoryExporter
	tp  *sdktrace.TracerProvider
}

func newTracing(t *testing.T) *tracing {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracing{exp: exp, tp: tp}
}

// produceTraced sends one record per key to partition i%partitions, each with
// its idempotency key and the W3C context of a "produce" span of its own,
// and returns those spans' contexts by key.
func (e *env) produceTraced(tr *tracing, keys []string, partitions int) map[string]trace.SpanContext {
	e.t.Helper()
	p := e.k.Producer(e.t)
	out := map[string]trace.SpanContext{}
	for i, k := range keys {
		ctx, span := tr.tp.Tracer("test").Start(context.Background(), "produce", trace.WithSpanKind(trace.SpanKindProducer))
		carrier := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(ctx, carrier)
		span.End()
		out[k] = span.SpanContext()
		hs := []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(k)}}
		for name, v := range carrier {
			hs = append(hs, sarama.RecordHeader{Key: []byte(name), Value: []byte(v)})
		}
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: int32(i % partitions),
			Key: sarama.StringEncoder(k), Value: sarama.StringEncoder(`{}`), Headers: hs}); err != nil {
			e.t.Fatal(err)
		}
	}
	return out
}

// spansNamed returns the ended spans called name.
func (tr *tracing) spansNamed(name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range tr.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s tracetest.SpanStub, key string) attribute.Value {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value
		}
	}
	return attribute.Value{}
}

// A message failing every attempt goes through an in-process retry, retry
// tier 1 and the DLQ; the trace holds every attempt, each tier's attempt is
// a child of the attempt that forwarded it, and the DLQ record carries the
// last attempt's context. Run in the plain, lanes and batch pipelines.
func TestTraceAcrossRetryTierIntoDLQ(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"", "lanes", "batch"} {
		t.Run("mode="+mode, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			tr := newTracing(t)
			cfg := e.config()
			switch mode {
			case "lanes":
				cfg.Concurrency = 4
			case "batch":
				cfg.Batch = consumer.BatchConfig{MaxMessages: 10}
			}
			cfg.TracerProvider = tr.tp
			cfg.Retry.Attempts = 2
			cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{100 * time.Millisecond}}
			h := handler.Func(func(ctx context.Context, m *handler.Message) error {
				if !trace.SpanContextFromContext(ctx).IsValid() {
					return handler.Permanent(errors.New("handler ctx carries no span"))
				}
				return errors.New("dependency down")
			})
			producers := e.produceTraced(tr, []string{"k1"}, 2)
			start(t, cfg, h)
			testenv.Eventually(t, 60*time.Second, func() error {
				if n := e.total(e.dlq(), 2); n != 1 {
					return fmt.Errorf("DLQ holds %d records", n)
				}
				return nil
			})
			prod := producers["k1"]
			var spans []tracetest.SpanStub
			testenv.Eventually(t, 10*time.Second, func() error {
				spans = tr.spansNamed("idem.handle")
				if len(spans) != 4 {
					return fmt.Errorf("%d idem.handle spans, want 4 (tier 0: 2 attempts, tier 1: 2 attempts)", len(spans))
				}
				return nil
			})
			slices.SortFunc(spans, func(a, b tracetest.SpanStub) int {
				return int(attr(a, "idem.attempt").AsInt64() - attr(b, "idem.attempt").AsInt64())
			})
			want := []struct {
				attempt, tier int64
				outcome       string
			}{{1, 0, "retry"}, {2, 0, "retried"}, {3, 1, "retry"}, {4, 1, "dead_lettered"}}
			for i, s := range spans {
				w := want[i]
				if s.SpanContext.TraceID() != prod.TraceID() {
					t.Errorf("span %d: trace %s, want the producer's %s", i, s.SpanContext.TraceID(), prod.TraceID())
				}
				if got := attr(s, "idem.attempt").AsInt64(); got != w.attempt {
					t.Errorf("span %d: idem.attempt %d, want %d", i, got, w.attempt)
				}
				if got := attr(s, "idem.tier").AsInt64(); got != w.tier {
					t.Errorf("span %d: idem.tier %d, want %d", i, got, w.tier)
				}
				if got := attr(s, "idem.outcome").AsString(); got != w.outcome {
					t.Errorf("span %d: idem.outcome %q, want %q", i, got, w.outcome)
				}
				topic := e.topic
				if w.tier == 1 {
					topic = e.tier(1)
				}
				if got := attr(s, "messaging.destination.name").AsString(); got != topic {
					t.Errorf("span %d: messaging.destination.name %q, want %q", i, got, topic)
				}
				for k, v := range map[string]string{"messaging.system": "kafka", "messaging.consumer.group.name": e.group} {
					if got := attr(s, k).AsString(); got != v {
						t.Errorf("span %d: %s = %q, want %q", i, k, got, v)
					}
				}
				if attr(s, "messaging.kafka.offset").Type() != attribute.INT64 || attr(s, "messaging.kafka.destination.partition").Type() != attribute.INT64 {
					t.Errorf("span %d: offset/partition attributes missing: %v", i, s.Attributes)
				}
				if s.SpanKind != trace.SpanKindConsumer {
					t.Errorf("span %d: kind %v, want consumer", i, s.SpanKind)
				}
			}
			// The tree: tier 0's attempts are children of the producer; tier
			// 1's of the attempt that forwarded the record there.
			for i, parent := range []trace.SpanID{prod.SpanID(), prod.SpanID(), spans[1].SpanContext.SpanID(), spans[1].SpanContext.SpanID()} {
				if got := spans[i].Parent.SpanID(); got != parent {
					t.Errorf("span %d (attempt %d): parent %s, want %s", i, i+1, got, parent)
				}
			}
			// The DLQ record continues the trace from the last attempt.
			recs := e.readAll(e.dlq(), 2)
			if len(recs) != 1 {
				t.Fatalf("DLQ records: %d", len(recs))
			}
			got := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{
				"traceparent": header(recs[0], "traceparent"), "tracestate": header(recs[0], "tracestate")})
			sc := trace.SpanContextFromContext(got)
			if sc.TraceID() != prod.TraceID() || sc.SpanID() != spans[3].SpanContext.SpanID() {
				t.Errorf("DLQ traceparent %q: want trace %s span %s", header(recs[0], "traceparent"), prod.TraceID(), spans[3].SpanContext.SpanID())
			}
			if n := countHeader(recs[0], "traceparent"); n != 1 {
				t.Errorf("DLQ record has %d traceparent headers, want 1 (replaced, not appended)", n)
			}
		})
	}
}

func countHeader(m *sarama.ConsumerMessage, k string) int {
	n := 0
	for _, h := range m.Headers {
		if string(h.Key) == k {
			n++
		}
	}
	return n
}

// handler.Batch: a batch handler call has one idem.handle_batch span linked to
// every new message's producer context; a message that fails for good is
// attempted alone afterwards, with an idem.handle span that is a child of
// its producer and ends dead-lettered.
func TestTraceBatchHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	tr := newTracing(t)
	cfg := e.config()
	cfg.TracerProvider = tr.tp
	cfg.Concurrency = 1
	cfg.Batch = consumer.BatchConfig{MaxMessages: 10, MaxWait: 200 * time.Millisecond}
	keys := []string{"a", "b", "bad", "c"}
	producers := e.produceTraced(tr, keys, 1)
	h := handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
		if !trace.SpanContextFromContext(ctx).IsValid() {
			return errors.New("batch ctx carries no span")
		}
		for _, m := range msgs {
			if m.IdempotencyKey == "bad" {
				return handler.Permanent(errors.New("poison"))
			}
		}
		return nil
	})
	start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.total(e.dlq(), 1); n != 1 {
			return fmt.Errorf("DLQ holds %d records", n)
		}
		return nil
	})
	e.waitCommitted(e.topic, 1, 30*time.Second)
	batches := tr.spansNamed("idem.handle_batch")
	if len(batches) == 0 {
		t.Fatal("no idem.handle_batch span")
	}
	linked := map[trace.SpanID]bool{}
	for _, b := range batches {
		for _, l := range b.Links {
			linked[l.SpanContext.SpanID()] = true
		}
	}
	for _, k := range keys {
		if !linked[producers[k].SpanID()] {
			t.Errorf("no batch span links the producer of %s", k)
		}
	}
	var bad []tracetest.SpanStub
	for _, s := range tr.spansNamed("idem.handle") {
		if s.Parent.SpanID() == producers["bad"].SpanID() {
			bad = append(bad, s)
		}
	}
	if len(bad) == 0 || attr(bad[len(bad)-1], "idem.outcome").AsString() != "dead_lettered" {
		t.Fatalf("the poison message's attempt spans: %d, last outcome %q; want one ending dead_lettered", len(bad), attr(bad[max(len(bad)-1, 0)], "idem.outcome").AsString())
	}
	rec := e.readAll(e.dlq(), 1)[0]
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": header(rec, "traceparent")}))
	if sc.SpanID() != bad[len(bad)-1].SpanContext.SpanID() {
		t.Errorf("DLQ record's traceparent points at %s, want the dead-lettering attempt %s", sc.SpanID(), bad[len(bad)-1].SpanContext.SpanID())
	}
}

// failingStore is a dedupe store whose Process fails with a StoreError while
// down is set, as an unreachable database does.
type failingStore struct {
	dedupe.Store
	mu   sync.Mutex
	down bool
}

func (s *failingStore) setDown(v bool) {
	s.mu.Lock()
	s.down = v
	s.mu.Unlock()
}

func (s *failingStore) Process(ctx context.Context, rec dedupe.Record, fn func(context.Context) error) (dedupe.Outcome, error) {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down {
		return 0, &dedupe.StoreError{Op: "begin", Err: errors.New("connection refused")}
	}
	return s.Store.Process(ctx, rec, fn)
}

// Readiness goes ready once the group is joined and the store answers, not
// ready while the store fails, and not ready after Run returns; OnAssigned
// lists every claimed partition before any message is handled; OnRevoked
// runs for each partition after its offsets are committed.
func TestReadinessAndLifecycle(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	store := &failingStore{Store: dedupe.NewPostgres(e.pool)}
	ready := consumer.NewReadiness()
	if err := ready.Check(context.Background()); !errors.Is(err, consumer.ErrNotReady) {
		t.Fatalf("Check before Run = %v, want ErrNotReady", err)
	}
	keys := make([]string, 30)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	e.produce(keys, 3)

	var mu sync.Mutex
	var assigned, revoked []consumer.TopicPartition
	handledBeforeAssign := false
	handled := 0
	committedAtRevoke := map[int32]int64{}
	cfg := e.config()
	cfg.Dedupe = store
	cfg.Readiness = ready
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second}} // its tier is claimed too
	cfg.OnAssigned = func(ctx context.Context, tps []consumer.TopicPartition) {
		mu.Lock()
		defer mu.Unlock()
		if handled > 0 {
			handledBeforeAssign = true
		}
		assigned = append(assigned, tps...)
	}
	cfg.OnRevoked = func(ctx context.Context, tps []consumer.TopicPartition) {
		for _, tp := range tps {
			mu.Lock()
			revoked = append(revoked, tp)
			mu.Unlock()
			if tp.Topic != e.topic {
				continue
			}
			c := e.committed(tp.Topic, 3)[tp.Partition]
			mu.Lock()
			committedAtRevoke[tp.Partition] = c
			mu.Unlock()
		}
	}
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		mu.Lock()
		handled++
		mu.Unlock()
		return effectHandler()(ctx, m)
	})
	run := start(t, cfg, h)
	testenv.Eventually(t, 60*time.Second, func() error { return ready.Check(context.Background()) })
	e.waitCommitted(e.topic, 3, 30*time.Second)

	store.setDown(true)
	err := ready.Check(context.Background())
	if !errors.Is(err, consumer.ErrNotReady) {
		t.Fatalf("Check with the store down = %v, want ErrNotReady", err)
	}
	t.Logf("store down: %v", err)
	store.setDown(false)
	if err := ready.Check(context.Background()); err != nil {
		t.Fatalf("Check with the store back = %v", err)
	}

	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	if err := ready.Check(context.Background()); !errors.Is(err, consumer.ErrNotReady) {
		t.Errorf("Check after Run returned = %v, want ErrNotReady", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []consumer.TopicPartition{{e.topic, 0}, {e.topic, 1}, {e.topic, 2}}
	for p := range int32(3) {
		want = append(want, consumer.TopicPartition{Topic: e.tier(1), Partition: p})
	}
	sortTP := func(s []consumer.TopicPartition) {
		slices.SortFunc(s, func(a, b consumer.TopicPartition) int {
			if a.Topic != b.Topic {
				return strings.Compare(a.Topic, b.Topic)
			}
			return int(a.Partition - b.Partition)
		})
	}
	sortTP(assigned)
	sortTP(revoked)
	sortTP(want)
	if !slices.Equal(assigned, want) {
		t.Errorf("OnAssigned got %v, want %v", assigned, want)
	}
	if handledBeforeAssign {
		t.Error("a message was handled before OnAssigned returned")
	}
	if !slices.Equal(revoked, want) {
		t.Errorf("OnRevoked got %v, want %v", revoked, want)
	}
	ends := e.endOffsets(e.topic, 3)
	for p, end := range ends {
		if committedAtRevoke[p] != end {
			t.Errorf("partition %d: committed %d when OnRevoked ran, want the end %d", p, committedAtRevoke[p], end)
		}
	}
}

// idem_messages_in_flight counts messages taken and not final,
// idem_consumer_lag shows what the group has not committed, and
// idem_end_to_end_seconds observes each marked message; lag series go when
// the partitions are released.
func TestLagInFlightAndEndToEnd(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	cfg := e.config()
	cfg.LagInterval = 100 * time.Millisecond
	cfg.Retry.Tiers = retrytopic.Policy{Delays: []time.Duration{time.Second}} // tier partitions have lag series too
	release := make(chan struct{})
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return effectHandler()(ctx, m)
	})
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	e.produce(keys, 2)
	run := start(t, cfg, h)
	labels := map[string]string{"group": e.group, "topic": e.topic}
	testenv.Eventually(t, 60*time.Second, func() error {
		if got := metricValue(t, e, "idem_messages_in_flight", labels); got < 1 {
			return fmt.Errorf("in flight %v, want >= 1 while handlers block", got)
		}
		if got := metricValue(t, e, "idem_consumer_lag", labels); got != 20 {
			return fmt.Errorf("lag %v, want 20 while nothing is committed", got)
		}
		return nil
	})
	close(release)
	e.waitCommitted(e.topic, 2, 30*time.Second)
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metricValue(t, e, "idem_consumer_lag", labels); got != 0 {
			return fmt.Errorf("lag %v, want 0 once committed", got)
		}
		if got := metricValue(t, e, "idem_messages_in_flight", labels); got != 0 {
			return fmt.Errorf("in flight %v, want 0", got)
		}
		return nil
	})
	if n := seriesCount(t, e, "idem_consumer_lag", map[string]string{"group": e.group, "topic": e.tier(1)}); n != 2 {
		t.Errorf("idem_consumer_lag has %d series for tier 1, want 2 (one per partition)", n)
	}
	if got := metricValue(t, e, "idem_end_to_end_seconds", labels); got != 20 {
		t.Errorf("idem_end_to_end_seconds count %v, want 20", got)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "idem_consumer_lag" && len(mf.GetMetric()) > 0 {
			t.Errorf("idem_consumer_lag keeps %d series after Run returned", len(mf.GetMetric()))
		}
	}
}

// seriesCount counts the series of the metric family name whose labels
// include want.
func seriesCount(t *testing.T, e *env, name string, want map[string]string) int {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			n++
		}
	}
	return n
}

// Issue 18 #14: idem_consumer_lag has a series for a claimed partition from
// the start, not only after the first LagInterval.
func TestLagSampledAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config()
	cfg.LagInterval = time.Hour
	block := make(chan struct{})
	t.Cleanup(func() { close(block) })
	h := handler.Func(func(ctx context.Context, m *handler.Message) error {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return ctx.Err()
	})
	e.produce([]string{"a", "b", "c"}, 1)
	start(t, cfg, h)
	labels := map[string]string{"group": e.group, "topic": e.topic}
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metricValue(t, e, "idem_consumer_lag", labels); got != 3 {
			return fmt.Errorf("lag %v, want 3 (nothing committed) well before LagInterval", got)
		}
		return nil
	})
}

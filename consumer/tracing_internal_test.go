package consumer

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemhq/idem/handler"
)

// Injecting into a forwarded record replaces the producer's traceparent
// instead of adding a second one, and keeps every other header in order.
func TestRecordCarrierReplaces(t *testing.T) {
	hs := []sarama.RecordHeader{
		{Key: []byte("idempotency-key"), Value: []byte("k")},
		{Key: []byte("traceparent"), Value: []byte("old")},
		{Key: []byte("x"), Value: []byte("1")},
		{Key: []byte("traceparent"), Value: []byte("older")},
	}
	c := recordCarrier{&hs}
	c.Set("traceparent", "new")
	var keys []string
	for _, h := range hs {
		keys = append(keys, string(h.Key)+"="+string(h.Value))
	}
	if got := len(hs); got != 3 || keys[0] != "idempotency-key=k" || keys[1] != "x=1" || keys[2] != "traceparent=new" {
		t.Fatalf("headers after Set: %v", keys)
	}
	if c.Get("traceparent") != "new" {
		t.Fatalf("Get = %q", c.Get("traceparent"))
	}
}

// The cost of one attempt span with no SDK installed (the default
// otel.GetTracerProvider()), on a record carrying a traceparent: what every
// message pays for tracing when nobody exports traces.
func BenchmarkAttemptSpanNoSDK(b *testing.B) {
	for _, tc := range []struct {
		name    string
		headers []handler.Header
	}{
		{"traceparent", []handler.Header{
			{Key: "idempotency-key", Value: []byte("k")},
			{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		}},
		{"untraced", []handler.Header{{Key: "idempotency-key", Value: []byte("k")}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := &runner{cfg: Config{Propagator: propagation.TraceContext{}}}
			r.tracer = otel.GetTracerProvider().Tracer(tracerName)
			p := &observer{r: r, hctx: context.Background()}
			msg := &handler.Message{Topic: "t", Headers: tc.headers}
			b.ReportAllocs()
			for b.Loop() {
				p.traceMessage(msg, 0)
				_ = p.spanStart(msg)
				p.spanEnd(traceOutcomeProcessed, nil)
			}
		})
	}
}

// switchProvider is a TracerProvider whose tracers follow the provider set
// last, like otel's global one when an SDK is installed after start.
type switchProvider struct {
	embedded.TracerProvider
	cur atomic.Pointer[trace.TracerProvider]
}

func (s *switchProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return switchTracer{s: s, name: name}
}

type switchTracer struct {
	embedded.Tracer
	s    *switchProvider
	name string
}

func (t switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return (*t.s.cur.Load()).Tracer(t.name).Start(ctx, name, opts...)
}

// With no SDK, untraced messages start no span (the no-op path costs
// nothing); an SDK installed later is noticed within noRecordProbe messages,
// and from then on every message has its span.
func TestSpanSkippedWithoutSDKUntilOneIsInstalled(t *testing.T) {
	sp := &switchProvider{}
	var none trace.TracerProvider = noop.NewTracerProvider()
	sp.cur.Store(&none)
	r := &runner{cfg: Config{Propagator: propagation.TraceContext{}}}
	r.tracer = sp.Tracer(tracerName)
	p := &observer{r: r, hctx: context.Background()}
	msg := &handler.Message{Topic: "t", Headers: []handler.Header{{Key: "idempotency-key", Value: []byte("k")}}}
	run := func(n int) {
		for range n {
			p.traceMessage(msg, 0)
			_ = p.spanStart(msg)
			p.spanEnd(traceOutcomeProcessed, nil)
		}
	}
	run(10)
	if !r.noRecord.Load() {
		t.Fatal("a tracer without SDK was not noticed")
	}
	rec := tracetest.NewSpanRecorder()
	var sdk trace.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	sp.cur.Store(&sdk)
	run(noRecordProbe)
	if n := len(rec.Ended()); n == 0 {
		t.Fatalf("no span within %d messages of installing an SDK", noRecordProbe)
	}
	before := len(rec.Ended())
	run(5)
	if got := len(rec.Ended()) - before; got != 5 {
		t.Fatalf("%d spans for 5 messages once the SDK is seen", got)
	}
}

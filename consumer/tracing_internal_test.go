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

// switchPropagator extracts with the propagator set last, like otel's global
// one when the program sets it after Run starts; calls counts its Extracts.
type switchPropagator struct {
	cur   atomic.Pointer[propagation.TextMapPropagator]
	calls atomic.Int64
}

func (s *switchPropagator) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	(*s.cur.Load()).Inject(ctx, c)
}

func (s *switchPropagator) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	s.calls.Add(1)
	return (*s.cur.Load()).Extract(ctx, c)
}

func (s *switchPropagator) Fields() []string { return (*s.cur.Load()).Fields() }

// xTrace is a propagator that reads a W3C traceparent from the x-trace
// header: a field the default propagator does not know.
type xTrace struct{ propagation.TraceContext }

func (xTrace) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	return propagation.TraceContext{}.Extract(ctx, renamed{c})
}

type renamed struct{ propagation.TextMapCarrier }

func (r renamed) Get(key string) string {
	if key == "traceparent" {
		key = "x-trace"
	}
	return r.TextMapCarrier.Get(key)
}

// With no SDK, spanStart skips the default propagator's Extract for a record
// without a traceparent, and only then: a record with one is its span's
// child; a propagator of the program's own, even one that changes after
// start, extracts every record; and a handler ctx that carries a span makes
// every record's span its child.
func TestSpanStartExtractsWhatThePropagatorFinds(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	want, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	plain := &handler.Message{Topic: "t", Headers: []handler.Header{{Key: "idempotency-key", Value: []byte("k")}}}
	w3c := &handler.Message{Topic: "t", Headers: []handler.Header{{Key: "idempotency-key", Value: []byte("k")}, {Key: "traceparent", Value: []byte(tp)}}}
	other := &handler.Message{Topic: "t", Headers: []handler.Header{{Key: "x-trace", Value: []byte(tp)}}}
	newObserver := func(p propagation.TextMapPropagator, hctx context.Context) *observer {
		r := &runner{cfg: Config{Propagator: p}}
		r.tracer = noop.NewTracerProvider().Tracer(tracerName)
		r.noRecord.Store(true)
		return &observer{r: r, hctx: hctx}
	}
	start := func(o *observer, msg *handler.Message) trace.SpanContext {
		o.traceMessage(msg, 0)
		ctx := o.spanStart(msg)
		o.spanEnd(traceOutcomeProcessed, nil)
		return trace.SpanContextFromContext(ctx)
	}

	o := newObserver(propagation.TraceContext{}, context.Background())
	if sc := start(o, plain); sc.IsValid() {
		t.Fatalf("an untraced record has span context %v", sc)
	}
	if sc := start(o, w3c); sc.TraceID() != want {
		t.Fatalf("a record with a traceparent: trace %v, want %v", sc.TraceID(), want)
	}

	sp := &switchPropagator{}
	var tc propagation.TextMapPropagator = propagation.TraceContext{}
	sp.cur.Store(&tc)
	o = newObserver(sp, context.Background())
	if sc := start(o, other); sc.IsValid() || sp.calls.Load() != 1 {
		t.Fatalf("before the switch: span context %v, %d Extracts", sc, sp.calls.Load())
	}
	var x propagation.TextMapPropagator = xTrace{}
	sp.cur.Store(&x)
	for range 3 {
		if sc := start(o, other); sc.TraceID() != want {
			t.Fatalf("after the switch: trace %v, want %v", sc.TraceID(), want)
		}
	}
	if sp.calls.Load() != 4 {
		t.Fatalf("%d Extracts for 4 records", sp.calls.Load())
	}

	parent := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": tp}))
	o = newObserver(propagation.TraceContext{}, trace.ContextWithRemoteSpanContext(context.Background(), parent))
	for range 3 {
		if sc := start(o, plain); sc.TraceID() != want {
			t.Fatalf("under a traced handler ctx: trace %v, want %v", sc.TraceID(), want)
		}
	}
}

package consumer

import (
	"context"
	"testing"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

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
			r.tracer = otel.GetTracerProvider().Tracer(TracerName)
			p := &partition{r: r, hctx: context.Background()}
			msg := &handler.Message{Topic: "t", Headers: tc.headers}
			b.ReportAllocs()
			for b.Loop() {
				p.traceMessage(msg, 0)
				_ = p.spanStart(msg)
				p.spanEnd(TraceOutcomeProcessed, nil)
			}
		})
	}
}

package outbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/outbox"
)

// headerCorrelationID is the header of the wire contract that carries a
// correlation id.
const headerCorrelationID = "idem-correlation-id"

// TestOneTraceFromHandlerToNextConsumer: a request (a client span and a
// correlation id in its record's headers) reaches service A, whose handler
// enqueues an event; the relay publishes it; service B consumes it. Every
// span is one trace, in an in-memory exporter: A's idem.handle is the
// client's child, the relay's idem.outbox.publish is A's child and linked
// to it, B's idem.handle is the publish's child. B's handler sees the
// correlation id, carried by the event's header; a request without one
// gets its idempotency key. Neither service adds a middleware: consumer.Run
// puts the correlation id into the handler's ctx. Real Kafka and
// PostgreSQL, consumer.Run twice.
func TestOneTraceFromHandlerToNextConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	withTracer := func(c *consumer.Config) { c.TracerProvider = tp }
	in := e.k.Topic(t, "in", 1)
	published := e.consume(e.topic)

	relay, _ := e.relay(e.pool)
	relay.TracerProvider = tp
	// No middleware: consumer.Run puts the correlation id into ctx itself.
	a := handler.Func(func(ctx context.Context, m *handler.Message) error {
		return outbox.Enqueue(ctx, dedupe.Tx(ctx), outbox.Message{Topic: e.topic, Key: m.Key, Value: m.Value})
	})
	e.runConsumer(in, e.k.Group(t, "a"), prometheus.NewRegistry(), relay, a.Handle, withTracer)

	type seen struct {
		corr string
		sc   trace.SpanContext
	}
	got := make(chan seen, 2)
	b := handler.Func(func(ctx context.Context, m *handler.Message) error {
		got <- seen{outbox.CorrelationID(ctx), trace.SpanContextFromContext(ctx)}
		return nil
	})
	e.runConsumer(e.topic, e.k.Group(t, "b"), prometheus.NewRegistry(), nil, b.Handle, withTracer)

	ctx, client := tp.Tracer("test").Start(context.Background(), "client", trace.WithSpanKind(trace.SpanKindProducer))
	tc := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, tc)
	client.End()
	e.k.Produce(t, in, idemtest.Record{IdempotencyKey: "req-1", Key: []byte("k"), Value: []byte("v1"), Headers: []handler.Header{
		{Key: "traceparent", Value: []byte(tc["traceparent"])},
		{Key: headerCorrelationID, Value: []byte("corr-1")},
	}})
	var first seen
	select {
	case first = <-got:
	case <-time.After(60 * time.Second):
		t.Fatal("service B never handled the event")
	}
	if first.corr != "corr-1" {
		t.Fatalf("B's handler saw correlation id %q, want corr-1", first.corr)
	}
	traceID := client.SpanContext().TraceID()
	if first.sc.TraceID() != traceID {
		t.Fatalf("B's handler runs in trace %s, want the client's %s", first.sc.TraceID(), traceID)
	}

	// The spans: A's attempt, the publish, B's attempt, one trace, each the
	// parent of the next.
	var handleA, publish, handleB tracetest.SpanStub
	idemtest.Eventually(t, 30*time.Second, func() error {
		handleA, publish, handleB = tracetest.SpanStub{}, tracetest.SpanStub{}, tracetest.SpanStub{}
		for _, s := range exp.GetSpans() {
			if s.SpanContext.TraceID() != traceID {
				continue
			}
			switch {
			case s.Name == "idem.outbox.publish":
				publish = s
			case s.Name == "idem.handle" && attr(s, "messaging.destination.name") == in:
				handleA = s
			case s.Name == "idem.handle" && attr(s, "messaging.destination.name") == e.topic:
				handleB = s
			}
		}
		if handleA.Name == "" || publish.Name == "" || handleB.Name == "" {
			return fmt.Errorf("spans of the trace so far: A %q, publish %q, B %q", handleA.Name, publish.Name, handleB.Name)
		}
		return nil
	})
	if handleA.Parent.SpanID() != client.SpanContext().SpanID() {
		t.Errorf("A's idem.handle's parent is %s, want the client span %s", handleA.Parent.SpanID(), client.SpanContext().SpanID())
	}
	if publish.Parent.SpanID() != handleA.SpanContext.SpanID() {
		t.Errorf("idem.outbox.publish's parent is %s, want A's idem.handle %s", publish.Parent.SpanID(), handleA.SpanContext.SpanID())
	}
	if len(publish.Links) != 1 || publish.Links[0].SpanContext.SpanID() != handleA.SpanContext.SpanID() {
		t.Errorf("idem.outbox.publish's links = %v, want one to A's idem.handle", publish.Links)
	}
	if publish.SpanKind != trace.SpanKindProducer || attr(publish, "idem.correlation_id") != "corr-1" || attr(publish, "messaging.destination.name") != e.topic {
		t.Errorf("idem.outbox.publish: kind %v, attributes %v", publish.SpanKind, publish.Attributes)
	}
	if handleB.Parent.SpanID() != publish.SpanContext.SpanID() {
		t.Errorf("B's idem.handle's parent is %s, want idem.outbox.publish %s", handleB.Parent.SpanID(), publish.SpanContext.SpanID())
	}
	if handleB.SpanContext.SpanID() != first.sc.SpanID() {
		t.Errorf("B's handler ran in span %s, want B's idem.handle %s", first.sc.SpanID(), handleB.SpanContext.SpanID())
	}
	published.waitKeys(t, "k")
	if m := published.snapshot()[0]; header(m, headerCorrelationID) != "corr-1" || header(m, "traceparent") == "" {
		t.Errorf("the published record's headers: correlation %q, traceparent %q", header(m, headerCorrelationID), header(m, "traceparent"))
	}

	// A request without a correlation id: the chain takes its idempotency key.
	e.k.Produce(t, in, idemtest.Record{IdempotencyKey: "req-2", Key: []byte("k"), Value: []byte("v2")})
	select {
	case s := <-got:
		if s.corr != "req-2" {
			t.Fatalf("B saw correlation id %q for a request without one, want its idempotency key req-2", s.corr)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("service B never handled the second event")
	}
}

// attr returns the string attribute key of s, "" when it has none.
func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// TestEnqueueKeepsTheMessagesOwnTraceHeaders: headers a message sets itself
// win over the context's; a ctx without a span or a correlation id adds
// nothing.
func TestEnqueueKeepsTheMessagesOwnTraceHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("test").Start(outbox.WithCorrelationID(t.Context(), "from-ctx"), "handler")
	defer span.End()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	own := outbox.Message{Topic: e.topic, Headers: []handler.Header{{Key: headerCorrelationID, Value: []byte("own")}}}
	if err := outbox.Enqueue(ctx, tx, own); err != nil {
		t.Fatal(err)
	}
	if err := outbox.Enqueue(context.Background(), tx, outbox.Message{Topic: e.topic}); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "SELECT header_keys, header_values FROM idem_outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var keys [][]string
	var vals [][][]byte
	for rows.Next() {
		var k []string
		var v [][]byte
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		keys, vals = append(keys, k), append(vals, v)
	}
	if len(keys) != 2 || fmt.Sprint(keys[0]) != "[idem-correlation-id traceparent]" || string(vals[0][0]) != "own" ||
		string(vals[0][1]) != fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID()) {
		t.Fatalf("first row's headers: %v = %q", keys[0], vals[0])
	}
	if len(keys[1]) != 0 {
		t.Fatalf("a ctx with neither span nor correlation id added headers %v", keys[1])
	}
}

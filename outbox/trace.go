package outbox

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/correlation"
)

// This file carries a trace and a correlation id through the outbox:
// Enqueue writes the handler's trace context and correlation id into the
// row's headers, and the relay publishes each row in a span of its own,
// a child of (and linked to) the enqueue's context, whose context the
// record then carries to the next consumer.

// WithCorrelationID returns a copy of ctx carrying id as its correlation
// id: the id that ties together every event one business request causes,
// across services. Enqueue puts it on each message (header
// idem-correlation-id), and a saga started in ctx keeps it for all its steps
// and compensations. An empty id leaves ctx as it is.
func WithCorrelationID(ctx context.Context, id string) context.Context {
	return correlation.With(ctx, id)
}

// CorrelationID returns the correlation id ctx carries, "" when none:
// WithCorrelationID's; in an idem handler's ctx, the consumed message's
// (its idem-correlation-id header or, for a message without one, its
// idempotency key, which consumer.Run puts there); a saga step's.
func CorrelationID(ctx context.Context) string { return correlation.From(ctx) }

// enqueuePropagator writes the trace context Enqueue stores: W3C trace
// context always (traceparent, tracestate), then whatever else the
// program's global propagator writes (baggage, say). The consumer reads W3C
// trace context by default, so the global no-op propagator of a program
// that set none does not break the trace.
func enqueuePropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, otel.GetTextMapPropagator())
}

// mapCarrier collects what a propagator writes, in order, the last value of
// a key winning.
type mapCarrier struct {
	keys []string
	vals map[string]string
}

func (c *mapCarrier) Get(key string) string { return c.vals[key] }

func (c *mapCarrier) Set(key, value string) {
	if c.vals == nil {
		c.vals = map[string]string{}
	}
	if _, ok := c.vals[key]; !ok {
		c.keys = append(c.keys, key)
	}
	c.vals[key] = value
}

func (c *mapCarrier) Keys() []string { return c.keys }

// contextHeaders is what Enqueue adds to each message from ctx: the trace
// context of ctx's span and its correlation id, in that order.
func contextHeaders(ctx context.Context) []handler.Header {
	var c mapCarrier
	if trace.SpanContextFromContext(ctx).IsValid() {
		enqueuePropagator().Inject(ctx, &c)
	}
	if id := correlation.From(ctx); id != "" {
		c.Set(correlation.Header, id)
	}
	hs := make([]handler.Header, len(c.keys))
	for i, k := range c.keys {
		hs[i] = handler.Header{Key: k, Value: []byte(c.vals[k])}
	}
	return hs
}

// withContextHeaders returns m's headers followed by those of ctx that m
// does not set itself.
func withContextHeaders(m Message, ctx []handler.Header) []handler.Header {
	hs := m.Headers
	for _, h := range ctx {
		if !hasHeader(m.Headers, h.Key) {
			hs = append(hs[:len(hs):len(hs)], h)
		}
	}
	return hs
}

func hasHeader(hs []handler.Header, key string) bool {
	for _, h := range hs {
		if h.Key == key {
			return true
		}
	}
	return false
}

// rowCarrier reads and writes a row's stored headers for a propagator; Set
// replaces a header's value.
type rowCarrier struct{ r *row }

func (c rowCarrier) Get(key string) string {
	for i := len(c.r.hkeys) - 1; i >= 0; i-- {
		if c.r.hkeys[i] == key {
			return string(c.r.hvals[i])
		}
	}
	return ""
}

func (c rowCarrier) Set(key, value string) {
	for i, k := range c.r.hkeys {
		if k == key {
			c.r.hvals[i] = []byte(value)
			return
		}
	}
	c.r.hkeys = append(c.r.hkeys, key)
	c.r.hvals = append(c.r.hvals, []byte(value))
}

func (c rowCarrier) Keys() []string { return c.r.hkeys }

// tracerName is the instrumentation scope of the relay's spans.
const tracerName = "github.com/idemhq/idem/outbox"

// spanPublish is the name of the span of one row's publish.
const spanPublish = "idem.outbox.publish"

// publishSpan starts the span of publishing r: a producer span whose parent
// is the trace context the row carries (the handler's that enqueued it),
// linked to that context too, since the publish happens later, in another
// process; then writes the span's own context into the row's headers, so
// the record continues the trace.
func (s *session) publishSpan(r *row) trace.Span {
	parent := s.cfg.Propagator.Extract(context.Background(), rowCarrier{r})
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	if sc := trace.SpanContextFromContext(parent); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc,
			Attributes: []attribute.KeyValue{attribute.String("idem.link", "enqueue")}}))
	}
	ctx, span := s.tracer.Start(parent, spanPublish, opts...)
	if span.IsRecording() {
		attrs := []attribute.KeyValue{
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "send"),
			attribute.String("messaging.destination.name", r.topic),
			attribute.String("messaging.message.id", r.eventID),
			attribute.String("idem.outbox.table", s.t.name),
			attribute.Int64("idem.outbox.id", r.id),
		}
		if id := (rowCarrier{r}).Get(correlation.Header); id != "" {
			attrs = append(attrs, attribute.String("idem.correlation_id", id))
		}
		span.SetAttributes(attrs...)
	}
	s.cfg.Propagator.Inject(ctx, rowCarrier{r})
	return span
}

// endPublishSpan ends a row's publish span with the record's partition and
// offset, or its error.
func endPublishSpan(span trace.Span, partition int32, offset int64, err error) {
	if span.IsRecording() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(attribute.Int("messaging.destination.partition.id", int(partition)),
				attribute.Int64("messaging.kafka.offset", offset))
		}
	}
	span.End()
}

package consumer

import (
	"context"

	"github.com/IBM/sarama"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemhq/idem/handler"
)

// tracerName is the instrumentation scope of the spans idem starts
// (the package doc's Tracing section names it).
const tracerName = "github.com/idemhq/idem/consumer"

// The span names, as the package doc's Tracing section lists them.
const (
	// spanHandle is the span of one attempt of one message.
	spanHandle = "idem.handle"
	// spanHandleBatch is the span of one batch handler call (handler.Batch, or
	// Config.Batch), linked to each message's producer context.
	spanHandleBatch = "idem.handle_batch"
)

// The values of the idem.outcome attribute, listed in the package doc's
// Tracing section.
const (
	traceOutcomeProcessed    = "processed"     // the handler succeeded; effects committed
	traceOutcomeDuplicate    = "duplicate"     // the key was already done; handler not called
	traceOutcomeRetry        = "retry"         // failed; an in-process retry follows
	traceOutcomeRetried      = "retried"       // failed; forwarded to a retry tier
	traceOutcomeDeadLettered = "dead_lettered" // failed (or no key); forwarded to the dead-letter topic
	traceOutcomeOutage       = "outage"        // the dedupe store was unreachable; tried again, no attempt counted
	traceOutcomeBreakerOpen  = "breaker_open"  // a breaker was open; the partition waits
	traceOutcomeAbandoned    = "abandoned"     // cut short by revoke or shutdown; left for redelivery
	traceOutcomeFailed       = "failed"        // a batch failed; its messages run again one by one
	traceOutcomeDeferred     = "deferred"      // the handler deferred it (handler.DeferUntil): stored for the scheduler
	traceOutcomeExpired      = "expired"       // past its deadline or maximum age, and dropped (Expiry.Drop); handler not called
)

// Attribute keys of idem's spans (OpenTelemetry messaging conventions, plus
// idem's own).
const (
	attrAttempt = attribute.Key("idem.attempt")
	attrTier    = attribute.Key("idem.tier")
	attrOutcome = attribute.Key("idem.outcome")
)

// msgCarrier reads a handler.Message's headers for a propagator; the last
// value of a repeated header wins, as with Message.Header.
type msgCarrier struct{ m *handler.Message }

func (c msgCarrier) Get(key string) string {
	v, _ := c.m.Header(key)
	return string(v)
}

func (c msgCarrier) Set(string, string) {} // extraction only

func (c msgCarrier) Keys() []string {
	ks := make([]string, 0, len(c.m.Headers))
	for _, h := range c.m.Headers {
		ks = append(ks, h.Key)
	}
	return ks
}

// recordCarrier writes a forwarded record's headers: Set replaces every
// earlier value of the header.
type recordCarrier struct{ hs *[]sarama.RecordHeader }

func (c recordCarrier) Get(key string) string {
	for i := len(*c.hs) - 1; i >= 0; i-- {
		if string((*c.hs)[i].Key) == key {
			return string((*c.hs)[i].Value)
		}
	}
	return ""
}

func (c recordCarrier) Set(key, value string) {
	hs := (*c.hs)[:0:0]
	for _, h := range *c.hs {
		if string(h.Key) != key {
			hs = append(hs, h)
		}
	}
	*c.hs = append(hs, sarama.RecordHeader{Key: []byte(key), Value: []byte(value)})
}

func (c recordCarrier) Keys() []string {
	ks := make([]string, 0, len(*c.hs))
	for _, h := range *c.hs {
		ks = append(ks, string(h.Key))
	}
	return ks
}

// spanState is the attempt span a worker has open, for the message it is
// taking to an outcome.
type spanState struct {
	msg  *handler.Message
	tier int // the retry tier msg was read from; 0 for a source topic
	span trace.Span
	ctx  context.Context // the handler's ctx with span
}

// traceMessage records that msg, read from retry tier tier (0: a source
// topic), is the message the worker's next spans belong to.
func (o *observer) traceMessage(msg *handler.Message, tier int) {
	o.spanEnd(traceOutcomeAbandoned, nil)
	o.tspan = spanState{msg: msg, tier: tier}
}

// noRecordProbe: with a tracer that does not record, one untraced message in
// noRecordProbe starts a span anyway (spanStart).
const noRecordProbe = 1024

// consumerKind is the start option of every attempt span, made once.
var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// spanStart opens the attempt span of msg, a child of the trace context in
// msg's headers, unless one is open for msg already, and returns the
// handler's ctx carrying it.
//
// When the tracer is known not to record (no SDK installed: the last span it
// started neither recorded nor had a valid context) and msg carries no trace
// context, no span is started: the handler's ctx is the parent as extracted.
// Every noRecordProbe-th such message starts a span anyway, so an SDK
// installed after Run started is noticed; a message with a trace context
// always gets a span.
func (o *observer) spanStart(msg *handler.Message) context.Context {
	if o.tspan.ctx != nil && o.tspan.msg == msg {
		return o.tspan.ctx
	}
	tier := 0
	if o.tspan.msg == msg {
		tier = o.tspan.tier
	}
	o.spanEnd(traceOutcomeAbandoned, nil)
	r := o.r
	parent := o.hctx
	if _, w3c := r.cfg.Propagator.(propagation.TraceContext); !w3c || hasValue(msg, traceparent) {
		// The default propagator finds nothing, and returns its ctx, in a
		// record without a traceparent: the common record pays no Extract.
		// Any other (otel.GetTextMapPropagator(), whose global may be set
		// after Run starts) always extracts.
		parent = r.cfg.Propagator.Extract(o.hctx, msgCarrier{msg})
	}
	if r.noRecord.Load() && !o.traced(parent) {
		if o.unprobed++; o.unprobed < noRecordProbe {
			o.tspan = spanState{msg: msg, tier: tier, ctx: parent}
			return parent
		}
		o.unprobed = 0
	}
	ctx, span := r.tracer.Start(parent, spanHandle, consumerKind)
	r.noRecord.Store(!span.IsRecording() && !span.SpanContext().IsValid())
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", msg.Topic),
			attribute.Int("messaging.kafka.destination.partition", int(msg.Partition)),
			attribute.Int64("messaging.kafka.offset", msg.Offset),
			attribute.String("messaging.consumer.group.name", r.cfg.Group),
			attrAttempt.Int(msg.Attempt),
			attrTier.Int(tier),
		)
	}
	o.tspan = spanState{msg: msg, tier: tier, span: span, ctx: ctx}
	return ctx
}

// traceparent is the header propagation.TraceContext reads first: without
// it, it reads nothing else and extracts nothing.
const traceparent = "traceparent"

// hasValue reports whether msg's header name, its last value as
// Message.Header gives it, is not empty.
func hasValue(msg *handler.Message, name string) bool {
	v, _ := msg.Header(name)
	return len(v) > 0
}

// traced reports whether parent, spanStart's extracted parent, carries a
// valid span context. A record without a trace context leaves parent the
// handler's ctx itself (a propagator returns its ctx unchanged when it finds
// nothing); o.hctx's answer is remembered, as finding it walks the ctx's
// chain of values for every record.
func (o *observer) traced(parent context.Context) bool {
	if parent != o.hctx { // extracted: a ctx of its own
		return trace.SpanContextFromContext(parent).IsValid()
	}
	if o.rootOf != o.hctx { // the first record, or hctx was wrapped since (stepScope)
		o.rootOf, o.rootTraced = o.hctx, trace.SpanContextFromContext(o.hctx).IsValid()
	}
	return o.rootTraced
}

// spanEnd ends the open attempt span, if any, with outcome; a non-nil err is
// recorded on it as the attempt's failure.
func (o *observer) spanEnd(outcome string, err error) {
	s := o.tspan.span
	o.tspan.span, o.tspan.ctx = nil, nil
	if s == nil {
		return
	}
	if s.IsRecording() {
		s.SetAttributes(attrOutcome.String(outcome))
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, err.Error())
		}
	}
	s.End()
}

// spanError records err on the open attempt span without ending it: the
// attempt failed and its outcome (retry, forward) is not decided yet.
func (o *observer) spanError(err error) {
	if s := o.tspan.span; s != nil && err != nil && s.IsRecording() {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
}

// injectTrace writes the trace context of msg's attempt span (opening one
// if none is: a message dead-lettered without an attempt, such as one
// without a key) into a forwarded record's headers, so the next tier's
// attempt, or the dead-letter record, continues the trace.
func (o *observer) injectTrace(hs []sarama.RecordHeader, msg *handler.Message) []sarama.RecordHeader {
	ctx := o.spanStart(msg)
	out := append([]sarama.RecordHeader(nil), hs...)
	o.r.cfg.Propagator.Inject(ctx, recordCarrier{&out})
	return out
}

// batchSpan starts the span of one batch handler call for items[idx] (the
// new messages of a batch), linked to the producer context of each (up to
// 128 links).
func (o *observer) batchSpan(ctx context.Context, items []*batchItem, idx []int) (context.Context, trace.Span) {
	r := o.r
	const maxLinks = 128
	links := make([]trace.Link, 0, min(len(idx), maxLinks))
	for _, i := range idx[:min(len(idx), maxLinks)] {
		it := items[i]
		sc := trace.SpanContextFromContext(r.cfg.Propagator.Extract(context.Background(), msgCarrier{it.msg}))
		if sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{
				attribute.Int64("messaging.kafka.offset", it.cm.Offset)}})
		}
	}
	ctx, span := r.tracer.Start(ctx, spanHandleBatch, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...))
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", o.tp.topic),
			attribute.Int("messaging.kafka.destination.partition", int(o.tp.partition)),
			attribute.Int("messaging.batch.message_count", len(idx)),
			attribute.String("messaging.consumer.group.name", r.cfg.Group),
			attrAttempt.Int(1),
			attrTier.Int(0),
		)
	}
	return ctx, span
}

// batchSpanEnd ends a batch span with outcome processed or failed.
func batchSpanEnd(span trace.Span, err error) {
	if span.IsRecording() {
		if err != nil {
			span.SetAttributes(attrOutcome.String(traceOutcomeFailed))
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(attrOutcome.String(traceOutcomeProcessed))
		}
	}
	span.End()
}

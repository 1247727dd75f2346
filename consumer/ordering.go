package consumer

import (
	"context"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/retrytopic"
)

// Ordering says whether a message in a retry tier may be overtaken by later
// messages of its Kafka key.
type Ordering int

const (
	// OrderingNone lets later messages of a key flow on while an earlier one
	// waits in a retry tier: the highest throughput, and per-key order is lost
	// for retried messages (as in Spring Kafka's retry topics). The default.
	OrderingNone Ordering = iota
	// OrderingByKey keeps per-key order (by the Kafka record key): while a
	// message of key K sits in a retry tier, later messages of K are parked
	// behind it (idem_messages_total{outcome="parked"}) instead of overtaking
	// it; when K's message succeeds or is dead-lettered, the parked ones follow
	// in their original order. Other keys flow on. The parked keys and the
	// parked messages (payload and headers) are stored in PostgreSQL
	// (Config.OrderingDB), so they survive restarts and rebalances. Records
	// with an empty Kafka key are not ordered.
	OrderingByKey
)

// String returns "none" or "by-key".
func (o Ordering) String() string {
	switch o {
	case OrderingNone:
		return "none"
	case OrderingByKey:
		return "by-key"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// orderStep runs a step of the ordering store, retrying it through database
// outages; false means the partition is stopping.
func (p *partition) orderStep(f func(ctx context.Context) error) bool {
	for n := 1; ; n++ {
		err := f(p.hctx)
		if err == nil {
			return true
		}
		p.r.m.StoreErrors.WithLabelValues(p.r.cfg.Group).Inc()
		p.log.Warn("idem: ordering store unavailable; retrying", "err", err, "try", n)
		if !sleep(p.stopCtx, p.r.outageDelay(n)) {
			return false
		}
	}
}

// park parks cm behind its key's head when the key is blocked by another
// message; parked=false means process it now.
func (p *partition) park(cm *sarama.ConsumerMessage, msg *handler.Message, o origin) (parked, ok bool) {
	rec := keyorder.Record{
		Topic: o.topic, Key: cm.Key, IdempotencyKey: msg.IdempotencyKey,
		Partition: o.partition, Offset: o.offset, Timestamp: cm.Timestamp, Value: cm.Value,
	}
	for _, h := range cm.Headers {
		if h != nil {
			rec.Headers = append(rec.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
		}
	}
	var st keyorder.State
	ok = p.orderStep(func(ctx context.Context) (err error) {
		st, err = p.r.order.Park(ctx, rec)
		return err
	})
	if ok && st == keyorder.Blocked {
		p.log.Debug("idem: parked behind an earlier message of its key", "offset", cm.Offset, "key", msg.IdempotencyKey)
	}
	return st == keyorder.Blocked, ok
}

// drain runs the messages parked behind head (now processed or
// dead-lettered) in their order. A parked message that fails retriably becomes
// the key's new head and goes to the first retry tier; the rest stay parked
// behind it. It returns false when the partition is stopping: the head is then
// not marked, and its redelivery drains again.
func (p *partition) drain(topic string, key []byte, head string) bool {
	r := p.r
	for {
		var next keyorder.Record
		var more bool
		if !p.orderStep(func(ctx context.Context) (err error) {
			next, more, err = r.order.Next(ctx, topic, key, head)
			return err
		}) {
			return false
		}
		if !more {
			return true
		}
		msg, headers := parkedMessage(next)
		rec := dedupe.Record{Group: r.cfg.Group, Key: next.IdempotencyKey, Topic: next.Topic, Partition: next.Partition, Offset: next.Offset}
		err, ok := p.process(rec, msg)
		if !ok {
			return false
		}
		if err == nil {
			if !p.orderStep(func(ctx context.Context) error { return r.order.Done(ctx, next.Seq) }) {
				return false
			}
			continue
		}
		src := retrytopic.Source{Topic: next.Topic, Partition: next.Partition, Offset: next.Offset, Timestamp: next.Timestamp, Group: r.cfg.Group}
		out := p.failure(src, next.Key, next.Value, headers, origin{topic: next.Topic, partition: next.Partition, offset: next.Offset}, msg, err)
		if out.tier == 0 {
			if !p.send(out, msg) || !p.orderStep(func(ctx context.Context) error { return r.order.Done(ctx, next.Seq) }) {
				return false
			}
			continue
		}
		// The parked message becomes the head: promote it (recording the
		// forward as pending) in one transaction, then forward it.
		pending := next
		pending.Tier = out.tier
		pending.Headers = pending.Headers[:0:0]
		for _, h := range out.rec.Headers {
			pending.Headers = append(pending.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
		}
		if !p.orderStep(func(ctx context.Context) error { return r.order.Promote(ctx, head, pending) }) {
			return false
		}
		if !p.send(out, msg) {
			return false // recovered at the next start from heads.pending
		}
		return p.orderStep(func(ctx context.Context) error {
			return r.order.Forwarded(ctx, next.Topic, next.Key, next.IdempotencyKey)
		})
	}
}

// parkedMessage rebuilds the handler message and headers of a parked record.
func parkedMessage(rec keyorder.Record) (*handler.Message, []*sarama.RecordHeader) {
	msg := &handler.Message{
		Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp,
		IdempotencyKey: rec.IdempotencyKey, Attempt: 1,
	}
	hs := make([]*sarama.RecordHeader, 0, len(rec.Headers))
	for _, h := range rec.Headers {
		msg.Headers = append(msg.Headers, handler.Header{Key: h.Key, Value: h.Value})
		hs = append(hs, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return msg, hs
}

// recoverPending forwards the heads whose forward a crash interrupted.
func (r *runner) recoverPending(ctx context.Context) error {
	pending, err := r.order.Pending(ctx, r.cfg.Topics)
	if err != nil {
		return err
	}
	for _, rec := range pending {
		hs := make([]sarama.RecordHeader, 0, len(rec.Headers))
		for _, h := range rec.Headers {
			hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
		}
		out := retrytopic.Record{
			Topic: r.policy.Tier(rec.Topic, r.cfg.Group, rec.Tier), Partition: rec.Partition,
			Key: rec.Key, Value: rec.Value, Headers: hs,
		}
		if err := r.fwd.Forward(ctx, out); err != nil {
			return fmt.Errorf("consumer: forward pending head %q: %w", rec.IdempotencyKey, err)
		}
		if err := r.order.Forwarded(ctx, rec.Topic, rec.Key, rec.IdempotencyKey); err != nil {
			return err
		}
		r.m.Messages.WithLabelValues(r.cfg.Group, rec.Topic, metrics.OutcomeRetried).Inc()
		r.log.Info("idem: forwarded a head left pending by a crash", "key", rec.IdempotencyKey, "to", out.Topic)
	}
	return nil
}

// claimOrdering runs when the partition is claimed, before its first message:
// it finishes the ordering store's work a previous owner left for this
// partition. false means the partition is stopping.
func (p *partition) claimOrdering() bool { return true }

// warnUnread logs, at start, parked messages this Run will not read.
func (r *runner) warnUnread(ctx context.Context) {}

package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/retrytopic"
)

// origin says where a record was first consumed and what its idem-* headers
// say about earlier failures. For a record from the source topic it is the
// record's own coordinates and a zero prior.
type origin struct {
	topic     string
	partition int32
	offset    int64
	tier      int // the retry tier the record was read from; 0 for a source topic
	prior     retrytopic.Failure
	attempts  int // deliveries before this one
}

// originOf decodes cm's idem-* headers. A record carries them when it was
// read from one of this group's retry tiers; headers that do not decode, or
// that belong to another group, are ignored (the record is then treated as
// fresh: safe, because the inbox still dedupes by key).
func (r *runner) originOf(cm *sarama.ConsumerMessage) origin {
	o := origin{topic: cm.Topic, partition: cm.Partition, offset: cm.Offset}
	f, ok, err := retrytopic.Decode(cm.Headers)
	if !ok || err != nil || f.Group != r.cfg.Group || f.OriginalTopic == "" || f.Tier < 1 {
		return o
	}
	if cm.Topic != r.policy.Tier(f.OriginalTopic, r.cfg.Group, f.Tier) {
		return o
	}
	o.topic, o.partition, o.offset = f.OriginalTopic, f.OriginalPartition, f.OriginalOffset
	o.tier, o.prior, o.attempts = f.Tier, f, f.Attempt
	return o
}

// waitDue holds a retry record until its idem-due-at: only this partition
// waits, and the wait ends at once when the claim is revoked.
func (p *partition) waitDue(cm *sarama.ConsumerMessage, o origin) bool {
	if o.tier == 0 || o.prior.DueAt.IsZero() {
		return true
	}
	if err := retrytopic.WaitDue(p.stopCtx, o.prior.DueAt, nil); err != nil {
		return false
	}
	p.r.m.RetryDelay.WithLabelValues(p.r.cfg.Group, cm.Topic).Observe(time.Since(o.prior.DueAt).Seconds())
	return true
}

// outbound is a failed message on its way to a retry tier or the DLQ.
type outbound struct {
	rec  retrytopic.Record
	tier int // 0: the dead-letter topic
	kind string
}

// failure decides where a failed message goes: to the next retry tier when
// its error is retriable and tiers remain, else to the dead-letter topic; and
// builds the record: key, value and original headers unchanged, idem-* headers
// set. src is where it was read (a source or a tier), o its origin.
func (p *partition) failure(src retrytopic.Source, key, value []byte, headers []*sarama.RecordHeader, o origin, msg *handler.Message, cause error) outbound {
	r := p.r
	now := time.Now()
	dest, tier, delay := r.policy.DLQ(o.topic, r.cfg.Group), 0, time.Duration(0)
	if p.retriable(cause) {
		dest, tier, delay = r.policy.Next(o.topic, r.cfg.Group, o.tier)
	}
	f := retrytopic.NewFailure(cause, src, o.prior, now)
	f.Attempt = msg.Attempt
	f.Tier = tier
	if tier > 0 {
		if ra, ok := handler.RetryAfterOf(cause); ok && ra > delay {
			delay = ra
		}
		f.DueAt = now.Add(delay)
	}
	return outbound{
		rec:  retrytopic.Record{Topic: dest, Partition: src.Partition, Key: key, Value: value, Headers: retrytopic.Encode(headers, f)},
		tier: tier,
		kind: string(f.Kind),
	}
}

// send forwards out and waits for the ack (acks=all). While forwarding fails
// the partition retries it with backoff; it returns false (nothing marked) only
// when the partition is stopping.
func (p *partition) send(out outbound, msg *handler.Message) bool {
	r := p.r
	dest := out.rec.Topic
	for n := 1; ; n++ {
		err := r.fwd.Forward(p.hctx, out.rec)
		if err == nil {
			break
		}
		r.m.ForwardErrors.WithLabelValues(r.cfg.Group, dest).Inc()
		p.log.Error("idem: forward failed; offset not marked, retrying", "offset", msg.Offset, "to", dest, "err", err, "try", n)
		if !sleep(p.stopCtx, r.outageDelay(n)) {
			return false
		}
	}
	r.m.Forwarded.WithLabelValues(r.cfg.Group, dest, out.kind).Inc()
	outcome := metrics.OutcomeRetried
	if out.tier == 0 {
		outcome = metrics.OutcomeDeadLettered
	}
	r.m.Messages.WithLabelValues(r.cfg.Group, msg.Topic, outcome).Inc()
	p.log.Info("idem: message forwarded", "offset", msg.Offset, "key", msg.IdempotencyKey, "to", dest, "kind", out.kind, "attempt", msg.Attempt)
	return true
}

// setupRetryTopics creates the missing tier and dead-letter topics of every
// source topic, with at least the source's partitions.
func (r *runner) setupRetryTopics(ctx context.Context, client sarama.Client) error {
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		return fmt.Errorf("consumer: admin: %w", err)
	}
	// Closing the admin would close the shared client; it holds no other resource.
	for _, t := range r.cfg.Topics {
		ps, err := client.Partitions(t)
		if err != nil {
			return fmt.Errorf("consumer: partitions of %s: %w", t, err)
		}
		if err := retrytopic.EnsureTopics(ctx, admin, r.policy.Topics(t, r.cfg.Group), int32(len(ps)), r.policy); err != nil {
			return fmt.Errorf("consumer: retry topics of %s: %w", t, err)
		}
	}
	if err := client.RefreshMetadata(); err != nil {
		return fmt.Errorf("consumer: metadata: %w", err)
	}
	return nil
}

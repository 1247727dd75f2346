package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/retrytopic"
	"github.com/idemhq/idem/schedule"
)

// Deferring a message (handler.DeferUntil, issue 21 "Long delays"): the
// message is stored in PostgreSQL (tables.Defer, table idem_deferred) in a
// transaction of its own, its offset is marked at once, and the group's
// scheduler (Config.Defer, one leader per group) publishes a copy to the
// source's deferred topic "<source>.<group>.deferred" when it is due. This
// group alone reads that topic; the copy carries the message's own headers
// (its idempotency key) and its origin (idem-original-*), so it is handled
// as the same message, deduplicated by the inbox. See
// docs/deferral-and-expiry.md.

// deferredTopic is the topic Config.Defer's scheduler publishes the deferred
// messages of source, as consumed by group, to: "<source>.<group>.deferred"
// (Config.Defer's doc names it). Run creates it (with the source's
// partitions, like a retry tier) and subscribes to it when Config.Defer is
// set.
func deferredTopic(source, group string) string { return source + "." + group + ".deferred" }

// scheduler is Config.Defer as Run runs it: Brokers, Sarama, Group, Logger
// and Registerer filled from c where unset; nil without Defer.
func (c Config) scheduler() *schedule.Scheduler {
	if c.Defer == nil {
		return nil
	}
	s := *c.Defer
	if len(s.Brokers) == 0 {
		s.Brokers = c.Brokers
	}
	if s.Sarama == nil {
		s.Sarama = c.Sarama
	}
	if s.Group == "" {
		s.Group = c.Group
	}
	if s.Logger == nil {
		s.Logger = c.Logger
	}
	if s.Registerer == nil {
		s.Registerer = c.Registerer
	}
	if s.EncryptionKeyFile == "" && s.EncryptionKey == "" {
		s.EncryptionKeyFile, s.EncryptionKey = c.EncryptionKeyFile, c.EncryptionKey
	}
	return &s
}

// validateDefer checks Config.Defer as Run will run it.
func (c Config) validateDefer() error {
	s := c.scheduler()
	if s == nil {
		return nil
	}
	if s.Group != c.Group {
		return fmt.Errorf("Defer.Group = %q: must be Config.Group (%q) or empty", s.Group, c.Group)
	}
	return s.Validate()
}

// startScheduler runs Config.Defer's scheduler on wg until ctx is done. It
// retries its own outages; an error it returns (a configuration Validate
// rejected, a Registerer holding its collectors) is logged, and consuming
// goes on: deferred rows wait in idem_deferred for a scheduler.
func startScheduler(ctx context.Context, wg *sync.WaitGroup, cfg Config, log *slog.Logger) {
	s := cfg.scheduler()
	if s == nil {
		return
	}
	wg.Go(func() {
		if err := s.Run(ctx); err != nil && ctx.Err() == nil {
			log.Error("idem: deferred-message scheduler stopped; deferred messages wait in PostgreSQL until one runs", "err", err)
		}
	})
}

// deferredTopics returns the deferred topics of c's sources; none without
// Config.Defer.
func (c Config) deferredTopics() []string {
	if c.Defer == nil {
		return nil
	}
	out := make([]string, 0, len(c.Topics))
	for _, t := range c.Topics {
		out = append(out, deferredTopic(t, c.Group))
	}
	return out
}

// deferredPolicy is the retrytopic policy whose one "tier" is source's
// deferred topic: forward.EnsureTopicsFor creates it like a tier (the source's
// partitions and record size), and its dead-letter topic is the fallback's.
func (s setup) deferredPolicy() retrytopic.Policy {
	p := s.policy
	p.Delays = []time.Duration{time.Second}
	p.TierTopic = func(topic, group string, _ int) string { return deferredTopic(topic, group) }
	return p
}

// deferredOrigin decodes a record of one of this group's deferred topics:
// its origin (idem-original-*, written by tables.DeferredRecordOf) with no tier
// and no due time; ok is false for a record that is not such a copy. The
// origin goes into prior too, so a forward of the copy (wire.NewFailure)
// names the source record, not the deferred copy, as its origin.
func (r *runner) deferredOrigin(cm *sarama.ConsumerMessage, f retrytopic.Failure) (origin, bool) {
	if r.cfg.Defer == nil || f.Tier != 0 || cm.Topic != deferredTopic(f.OriginalTopic, r.cfg.Group) {
		return origin{}, false
	}
	prior := retrytopic.Failure{OriginalTopic: f.OriginalTopic, OriginalPartition: f.OriginalPartition,
		OriginalOffset: f.OriginalOffset, OriginalTimestamp: f.OriginalTimestamp}
	return origin{topic: f.OriginalTopic, partition: f.OriginalPartition, offset: f.OriginalOffset,
		prior: prior, attempts: f.Attempt}, true
}

// errDeferNeedsConfig dead-letters a deferral when Config.Defer is not set.
var errDeferNeedsConfig = errors.New("consumer: the handler deferred the message (handler.DeferUntil), which needs Config.Defer")

// deferred handles a handler's deferral (handler.DeferUntil, read back with
// handler.DeferredUntil): it stores the message for its scheduler (deferMsg)
// and returns nil, so the caller settles and marks it as processed; or it
// returns the error to dead-letter it with (Config.Defer not set, a record
// tables.Defer refuses). id is the deferral's identity
// (deferralOf). stop is errStopping when the partition is stopping. failed
// that is not a deferral is returned as it is.
func (w *worker) deferred(msg *handler.Message, failed error, id string) (dlq, stop error) {
	until, ok := handler.DeferredUntil(failed)
	if !ok {
		return failed, nil
	}
	if w.r.cfg.Defer == nil {
		return handler.Permanent(fmt.Errorf("%w: %w", errDeferNeedsConfig, failed)), nil
	}
	if err := (deferrals{w}).deferMsg(msg, until, id); err != nil {
		if errors.Is(err, tables.ErrInvalidDeferred) {
			return handler.Permanent(err), nil
		}
		return nil, err
	}
	return nil, nil
}

// deferrals is a worker's stage of deferral storage: a deferred message
// stored once per deferral for its scheduler. deferred, on the worker, hands
// over to it. It holds nothing but the worker, so deferrals{w} costs nothing
// to make.
type deferrals struct{ *worker }

// deferMsg stores msg in idem_deferred to be published to its source's
// deferred topic at until (the handler's transaction was rolled back: the
// inbox recorded nothing of the message), once per deferral: the dedupe
// store records the deferral id under a key of its own (deferralRecord),
// and a redelivery of the record that deferred it (its offset not yet
// committed) finds it and stores nothing (decide.go: a deferred message
// stays deferred). When the store runs the record's function in a
// transaction on Config.Defer's own pool, the deferred row is inserted in
// that transaction: stored and recorded, or neither. Otherwise (another
// database, a store without transactions) the row commits first, in a
// transaction of its own, and a crash between the two commits defers the
// message a second time: both copies are published, and the inbox turns
// the second into a duplicate. An outage is retried with backoff, the
// partition waiting as for a failed forward. It returns errStopping when
// the partition is stopping, or tables.Defer's ErrInvalidRecord
// error.
func (w deferrals) deferMsg(msg *handler.Message, until time.Time, id string) error {
	r := w.r
	rec := tables.DeferredRecordOf(r.cfg.Group, deferredTopic(msg.Origin().Topic, r.cfg.Group), msg)
	rec.DLQ = r.deferDLQ(msg.Origin().Topic) // a sealed copy whose key is destroyed goes there (sealed.go)
	o := msg.Origin()
	// Under the message's replay epoch, as decide looks it up: a re-drive's
	// deferral is its own, not the first delivery's duplicate.
	key := deferralRecord(dedupe.Record{Group: r.cfg.Group, Topic: o.Topic, Partition: o.Partition, Offset: o.Offset, Epoch: msg.Epoch}, id)
	for n := 1; ; n++ {
		out, err := r.cfg.Dedupe.Process(w.hctx, key, func(ctx context.Context) error { return w.storeDeferral(ctx, rec, until) })
		switch {
		case err == nil:
			if out == dedupe.Duplicate {
				w.log.Debug("idem: message deferred already by an earlier delivery of this record", "offset", msg.Offset, "key", msg.IdempotencyKey)
			} else {
				r.m.Deferred.WithLabelValues(r.cfg.Group, msg.Origin().Topic).Inc()
			}
			r.m.Messages.WithLabelValues(r.cfg.Group, msg.Topic, w.rt.name, coremetrics.OutcomeDeferred).Inc()
			w.ob.spanEnd(traceOutcomeDeferred, nil)
			if w.debug {
				w.log.Debug("idem: message deferred", "offset", msg.Offset, "key", msg.IdempotencyKey, "until", until)
			}
			return nil
		case errors.Is(err, tables.ErrInvalidDeferred):
			return err
		case w.hctx.Err() != nil:
			return errStopping
		}
		w.stall.failed(err)
		r.m.StoreErrors.WithLabelValues(r.cfg.Group).Inc()
		w.log.Warn("idem: cannot store a deferred message; retrying", "offset", msg.Offset, "key", msg.IdempotencyKey, "err", err, "try", n)
		if !sleep(w.stopCtx, r.wait.outage(n)) {
			return errStopping
		}
	}
}

// storeDeferral inserts rec, due at until, in the dedupe store's
// transaction (ctx's, see deferMsg) when it is one on Config.Defer's pool,
// else in a transaction of its own on that pool.
func (w deferrals) storeDeferral(ctx context.Context, rec tables.DeferredRecord, until time.Time) error {
	pool := w.r.cfg.Defer.Pool
	if dedupe.HasTx(ctx) && w.r.deferSharesStore() {
		return tables.Defer(ctx, dedupe.Tx(ctx), rec, until, w.r.deferSealer)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := tables.Defer(ctx, tx, rec, until, w.r.deferSealer); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// deferSharesStore reports whether the dedupe store works on Config.Defer's
// own pool (it exposes its database, DB() dedupe.DB, and that is the pool),
// so a deferral can be inserted in the store's transaction.
func (r *runner) deferSharesStore() bool {
	d, ok := r.cfg.Dedupe.(interface{ DB() dedupe.DB })
	if !ok || r.cfg.Defer == nil || r.cfg.Defer.Pool == nil {
		return false
	}
	p, ok := d.DB().(*pgxpool.Pool)
	return ok && p == r.cfg.Defer.Pool
}

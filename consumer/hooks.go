package consumer

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/mutate"
)

// DeadLettered describes a message the consumer has just sent to a
// dead-letter topic, for Config.OnDeadLettered.
type DeadLettered struct {
	// Message is the message as the handler saw it (or would have: an
	// expired message or one without a key never reached it). Its Origin
	// is where it was first consumed.
	Message *handler.Message
	// Topic is the dead-letter topic the record went to (a rule's own, see
	// Config.Retry.Rules).
	Topic string
	// Kind and Error are the record's idem-error-kind and idem-error.
	Kind  handler.Kind
	Error string
}

// Expired describes a message the consumer did not handle because it
// expired (Config.Expiry), for Config.Expiry.OnExpired.
type Expired struct {
	// Message is the message; its Origin is where it was first consumed.
	Message *handler.Message
	// Reason says which limit it passed.
	Reason string
	// Dropped is true when Expiry.Drop dropped it; otherwise it was
	// dead-lettered with kind "expired" (and OnDeadLettered runs too).
	Dropped bool
}

// hookKey is the inbox key that records that hook ran for the message first
// consumed at o: at most once per message, whatever redeliveries, crashes or
// replays of its dead-letter record follow.
func hookKey(hook string, o handler.Origin) string {
	return fmt.Sprintf("idem:%s:%s/%d/%d", hook, o.Topic, o.Partition, o.Offset)
}

// hookCalls is a worker's stage of the user's hooks (OnDeadLettered,
// Expiry.OnExpired): each call once per message, recorded in the inbox.
// It holds nothing but the worker, so hookCalls{w} costs nothing to make.
type hookCalls struct{ *worker }

// runHook runs fn once per message and hook, in a transaction of the dedupe
// store that records hookKey in the inbox with fn's writes (so a service's
// row and the record commit together); a message whose hook already ran is
// skipped. Failures (an outage, fn's own error) are retried with backoff,
// the partition waiting, as for a failed forward: the hook is part of the
// message's outcome. errStopping: the partition is stopping.
func (w hookCalls) runHook(hook string, msg *handler.Message, fn func(ctx context.Context) error) error {
	return w.runHookKey(hook, hookKey(hook, msg.Origin()), msg, fn)
}

// runHookKey is runHook with the hook's inbox key, key.
func (w hookCalls) runHookKey(hook, key string, msg *handler.Message, fn func(ctx context.Context) error) error {
	r := w.r
	o := msg.Origin()
	if mutate.On(mutate.HookInbox) {
		key += ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
	}
	rec := dedupe.Record{Group: r.cfg.Group, Key: key, Topic: o.Topic, Partition: o.Partition, Offset: o.Offset}
	for n := 1; ; n++ {
		_, err := r.cfg.Dedupe.Process(w.hctx, rec, fn)
		if err == nil {
			return nil
		}
		w.stall.failed(err)
		w.log.Warn("idem: "+hook+" hook failed; retrying", "offset", msg.Offset, "key", msg.IdempotencyKey, "err", err, "try", n)
		if !sleep(w.stopCtx, r.wait.outage(n)) {
			return errStopping
		}
	}
}

// deadLettered runs Config.OnDeadLettered for msg, sent to the dead-letter
// topic as out (see runHook); without Transactions only (with them the hook
// is owed until the forward commits: settle.go).
func (w hookCalls) deadLettered(out outbound, msg *handler.Message) error {
	h := w.r.cfg.OnDeadLettered
	if h == nil {
		return nil
	}
	d := deadLetteredOf(out, msg)
	return w.runHook("dead-lettered", msg, func(ctx context.Context) error { return h(ctx, d) })
}

// deadLetteredOf is what OnDeadLettered gets for msg, sent to the
// dead-letter topic as out.
func deadLetteredOf(out outbound, msg *handler.Message) DeadLettered {
	return DeadLettered{Message: msg, Topic: out.rec.Topic, Kind: out.f.Kind, Error: out.f.Error}
}

// expiredHook runs Config.Expiry.OnExpired for x (see runHook); without
// Transactions only (with them the hook is owed until the outcome commits:
// settle.go).
func (w hookCalls) expiredHook(x Expired) error {
	h := w.rt.expiry.OnExpired
	return w.runHook("expired", x.Message, func(ctx context.Context) error { return h(ctx, x) })
}

package consumer

import (
	"context"
	"runtime/debug"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/correlation"
	"github.com/idemhq/idem/internal/mutate"
)

// wrap is what Run puts around the user's handler, outermost first: the
// message's correlation id in ctx (correlate), then the panic guard
// (recovered), so a panic never skips clearing the id.
func wrap(h handler.Handler) handler.Handler { return correlate(recovered(h)) }

// correlate puts the message's correlation id into the handler's ctx (issue
// 32 item 5; before, the outbox.Correlate middleware did): its
// idem-correlation-id header or, for a message without one, its idempotency
// key, which outbox.Enqueue writes on the events the handler enqueues and a
// saga it starts keeps (outbox.CorrelationID reads it). A worker's ctx has a
// slot for it (correlation.WithSlot, newWorker), set for the call's
// duration, so the no-op path makes no context per message; a ctx without
// one (a batch's) gets a context of its own. A batch handler
// (handler.BatchHandler) is called with one ctx for many messages, so it
// gets none: it sets it per message (outbox.WithCorrelationID).
func correlate(next handler.Handler) handler.Handler {
	return handler.Func(func(ctx context.Context, m *handler.Message) error {
		s := correlation.SlotOf(ctx)
		if s == nil {
			return next.Handle(correlation.ForMessage(ctx, m), m)
		}
		s.Set(m)
		err := next.Handle(ctx, m) // recovered: never panics
		s.Set(nil)
		return err
	})
}

// recovered turns a panic in h into a *handler.PanicError carrying the
// panic value and the stack (classified "panic": the DLQ at once). The
// mutation switch "recover" takes it out, for the swarm checker's proof
// (internal/mutate).
func recovered(h handler.Handler) handler.Handler {
	if mutate.On(mutate.Recover) {
		return h
	}
	return handler.Func(func(ctx context.Context, m *handler.Message) (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = &handler.PanicError{Value: v, Stack: debug.Stack()}
			}
		}()
		return h.Handle(ctx, m)
	})
}

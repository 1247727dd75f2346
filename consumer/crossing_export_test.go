package consumer

import (
	"context"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/forward"
)

// WithSendFault returns ctx carrying a hook that Run calls before each try
// of a forward's send; an error it returns is that try's result, as a send
// refused before it reached the broker would return it.
func WithSendFault(ctx context.Context, f func(rec forward.Record) error) context.Context {
	h := *hooks(ctx)
	h.sendFault = f
	return context.WithValue(ctx, testHooksKey{}, &h)
}

// WithBeforeSendHook returns ctx carrying a hook that the transaction owner
// of Run (Config.Transactions) calls just before it hands a record to the
// producer; failed returns the owner's Failed channel.
func WithBeforeSendHook(ctx context.Context, f func(rec forward.Record, failed func() <-chan struct{})) context.Context {
	h := *hooks(ctx)
	h.beforeSend = f
	return context.WithValue(ctx, testHooksKey{}, &h)
}

// WithAfterSendHook returns ctx carrying a hook that the transaction owner
// of Run calls just after the producer answered a record (err: its error).
func WithAfterSendHook(ctx context.Context, f func(rec forward.Record, err error)) context.Context {
	h := *hooks(ctx)
	h.afterSend = f
	return context.WithValue(ctx, testHooksKey{}, &h)
}

// WithDispatchHook returns ctx carrying a hook that the transactional
// producer's dispatcher calls for each record it takes, once it has checked
// that a transaction is open.
func WithDispatchHook(ctx context.Context, f func(msg *sarama.ProducerMessage)) context.Context {
	h := *hooks(ctx)
	h.dispatched = f
	return context.WithValue(ctx, testHooksKey{}, &h)
}

// TransactionalIDOf is the transactional.id Run uses for cfg (random
// without an InstanceID).
func TransactionalIDOf(cfg Config) string { return cfg.transactionalID() }

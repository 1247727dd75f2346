package consumer

import (
	"context"

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

// TransactionalIDOf is the transactional.id Run uses for cfg (random
// without an InstanceID).
func TransactionalIDOf(cfg Config) string { return cfg.transactionalID() }

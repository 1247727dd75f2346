package consumer

import (
	"context"

	"github.com/idemhq/idem/internal/keyorder"
)

// WithOrderHooks returns ctx carrying hooks that Run calls at exact points of
// the ordering steps (see orderHooks), for the external tests.
func WithOrderHooks(ctx context.Context, promoted, draining func(stop, hctx context.Context, r keyorder.Record)) context.Context {
	return withOrderHooks(ctx, &orderHooks{promoted: promoted, draining: draining})
}

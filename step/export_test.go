package step

import (
	"context"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/steptable"
)

// WithScope returns ctx as consumer.Run gives it to a handler: steps in db,
// of group, for the message with idempotency key key ("" in a batch).
func WithScope(ctx context.Context, db dedupe.DB, group, key string) context.Context {
	return steptable.WithScope(ctx, &steptable.Scope{DB: db, Group: group, Key: key})
}

package step

import (
	"context"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/tables"
)

// WithScope returns ctx as consumer.Run gives it to a handler: steps in db,
// of group, for the message with idempotency key key ("" in a batch).
func WithScope(ctx context.Context, db dedupe.DB, group, key string) context.Context {
	return tables.WithStepScope(ctx, &tables.StepScope{DB: db, Group: group, Key: key})
}

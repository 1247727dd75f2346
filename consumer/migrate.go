package consumer

import (
	"context"
	"fmt"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/outbox"
)

// Migrate creates or upgrades every table idem keeps in PostgreSQL: the inbox
// of dedupe.Postgres (opts may rename it, as for NewPostgres) and the tables of
// OrderingByKey and the outbox. The schema is versioned and embedded; Migrate is idempotent
// and safe when several processes start at once (an advisory lock serialises
// them). `idem migrate` runs it from the command line.
func Migrate(ctx context.Context, db dedupe.DB, opts ...dedupe.PostgresOption) error {
	if err := dedupe.Migrate(ctx, db, opts...); err != nil {
		return fmt.Errorf("consumer: migrate inbox: %w", err)
	}
	if err := keyorder.New(db, "").Migrate(ctx); err != nil {
		return fmt.Errorf("consumer: migrate ordering tables: %w", err)
	}
	if err := outbox.Migrate(ctx, db); err != nil { // idem_outbox
		return fmt.Errorf("consumer: migrate outbox: %w", err)
	}
	return nil
}

// Package schema is idem's whole PostgreSQL schema, created in one call.
// It is what idem.Migrate (the public entry point, at the module root) runs,
// and it lives here so that packages the root may not be imported by, such
// as idemtest, can create the same tables the same way. It stands alone
// rather than in internal/tables because it calls every package that keeps
// a table (dedupe, keyorder, outboxstore, seal, control), and dedupe and
// control import internal/tables.
package schema

import (
	"context"
	"fmt"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
)

// Migrate creates or upgrades every table idem keeps: the inbox (inbox
// names it, as for dedupe.NewPostgres), the ordering tables, the outbox
// (outboxTables, default idem_outbox), the saga and checkpoint tables, the
// failure index, the deferred messages, the durable steps, the data
// keys of payload encryption at rest (internal/seal) and the live controls
// (internal/control). Each step is versioned
// (internal/pgmigrate) and serialised by one advisory lock, so Migrate is
// idempotent and safe when several processes run it at once.
func Migrate(ctx context.Context, db dedupe.DB, inbox []dedupe.PostgresOption, outboxTables []string) error {
	steps := []struct {
		what string
		run  func(context.Context) error
	}{
		{"inbox", func(ctx context.Context) error { return dedupe.NewPostgres(db, inbox...).Migrate(ctx) }},
		{"ordering tables", keyorder.New(db, "").Migrate},
		{"outbox", func(ctx context.Context) error { return outboxstore.Migrate(ctx, db, outboxTables...) }},
		{"saga tables", func(ctx context.Context) error { return tables.MigrateSaga(ctx, db) }},
		{"checkpoint table", func(ctx context.Context) error { return tables.MigrateCheckpoint(ctx, db) }},
		{"failure index", func(ctx context.Context) error { return tables.MigrateIndex(ctx, db) }},
		{"deferred messages", func(ctx context.Context) error { return tables.MigrateDeferred(ctx, db) }},
		{"step table", func(ctx context.Context) error { return tables.MigrateSteps(ctx, db) }},
		{"encryption keys", func(ctx context.Context) error { return seal.Migrate(ctx, db) }},
		{"live controls", func(ctx context.Context) error { return control.Migrate(ctx, db) }},
		// A package that keeps tables of its own adds its step here, one
		// line; the root's TestMigrateCreatesEveryTable fails until it does.
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("migrate %s: %w", s.what, err)
		}
	}
	return nil
}

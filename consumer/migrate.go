package consumer

import (
	"context"
	"fmt"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/keyorder"
)

// Migrate creates or upgrades every table idem keeps in PostgreSQL, and is the
// one migration entry point a service needs (`idem migrate` runs it from the
// command line):
//
//   - the inbox of dedupe.Postgres and dedupe.PostgresLease, idem_processed
//     (opts may rename it, as for dedupe.NewPostgres), with the processed_at
//     index the sweeper uses;
//   - the tables of OrderingByKey, idem_ordering_heads and
//     idem_ordering_parked (Run also creates them when Ordering is on).
//
// The schema is versioned and embedded; Migrate is idempotent and safe when
// several processes start at once (an advisory lock serialises them), so a
// service may call it at every start. dedupe.Migrate and the stores' Migrate
// methods create the inbox table only.
func Migrate(ctx context.Context, db dedupe.DB, opts ...dedupe.PostgresOption) error {
	steps := []struct {
		what string
		run  func(context.Context) error
	}{
		{"inbox", func(ctx context.Context) error { return dedupe.Migrate(ctx, db, opts...) }},
		{"ordering tables", keyorder.New(db, "").Migrate},
		// Every other package that keeps tables adds its step here, one line
		// each, so that Migrate (and `idem migrate`) stays the only entry
		// point: the outbox (outbox.Migrate), saga and checkpoint tables.
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("consumer: migrate %s: %w", s.what, err)
		}
	}
	return nil
}

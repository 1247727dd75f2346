package consumer

import (
	"context"
	"fmt"

	"github.com/idemhq/idem/checkpoint"
	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/saga"
	"github.com/idemhq/idem/schedule"
)

// Migrate creates or upgrades every table idem keeps in PostgreSQL, and is the
// one migration entry point a service needs (`idem migrate` runs it from the
// command line):
//
//   - the inbox of dedupe.Postgres and dedupe.PostgresLease, idem_processed
//     (opts may rename it, as for dedupe.NewPostgres), with the processed_at
//     index the sweeper uses;
//   - the tables of OrderingByKey, idem_ordering_heads and
//     idem_ordering_parked (Run also creates them when Ordering is on);
//   - the transactional outbox, idem_outbox (package outbox);
//   - the saga orchestrator's idem_saga and idem_saga_step (package saga);
//   - the batch jobs' checkpoints, idem_checkpoint (package checkpoint);
//   - the failure index of idem console and Config.FailureIndex,
//     idem_dlq_records, idem_dlq_groups, idem_dlq_versions and
//     idem_dlq_audit (package console/index);
//   - the deferred messages of handler.DeferUntil, idem_deferred (package
//     schedule).
//
// The schema is versioned and embedded; Migrate is idempotent and safe when
// several processes start at once (an advisory lock serialises them), so a
// service may call it at every start. dedupe.Migrate, the stores' Migrate
// methods, outbox.Migrate, saga.Migrate, checkpoint.Migrate and index.Migrate each create
// their own tables only.
func Migrate(ctx context.Context, db dedupe.DB, opts ...dedupe.PostgresOption) error {
	steps := []struct {
		what string
		run  func(context.Context) error
	}{
		{"inbox", func(ctx context.Context) error { return dedupe.Migrate(ctx, db, opts...) }},
		{"ordering tables", keyorder.New(db, "").Migrate},
		{"outbox", func(ctx context.Context) error { return outbox.Migrate(ctx, db) }}, // idem_outbox
		{"saga tables", func(ctx context.Context) error { return saga.Migrate(ctx, db) }},
		{"checkpoint table", func(ctx context.Context) error { return checkpoint.Migrate(ctx, db) }},
		{"failure index", func(ctx context.Context) error { return index.Migrate(ctx, db) }},        // idem_dlq_records, idem_dlq_groups, idem_dlq_versions, idem_dlq_audit
		{"deferred messages", func(ctx context.Context) error { return schedule.Migrate(ctx, db) }}, // idem_deferred
		// A package that keeps tables of its own adds its step here, one line,
		// so that Migrate (and `idem migrate`) stays the only entry point.
	}
	for _, s := range steps {
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("consumer: migrate %s: %w", s.what, err)
		}
	}
	return nil
}

// Package tables is idem's tables in PostgreSQL outside the inbox, the
// ordering tables, the outbox, the data keys and the live controls (each
// of which its own package keeps): their SQL and versioned migrations, one
// file and one migrations/<component> directory per component, and the
// rows code outside the component reads or writes:
//
//   - checkpoint.go: idem_checkpoint, one row per batch job of package
//     checkpoint;
//   - saga.go: idem_saga and idem_saga_step, package saga's sagas;
//   - deferred.go, deferral.go: idem_deferred, the messages package
//     schedule delivers later;
//   - index.go: the failure index (idem_dlq_*) of package console/index;
//   - steps.go: idem_step, package step's durable steps;
//   - inbox.go: the inbox's retention, which package dedupe and package
//     consumer share (the inbox's SQL is package dedupe's own).
//
// idem.Migrate (through internal/schema) and `idem migrate` create them;
// services never call the Migrate functions themselves.
package tables

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/internal/pgmigrate"
)

//go:embed migrations
var migrationFS embed.FS

// DB is what the tables' functions need from a database: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it, as does dedupe.DB (the same methods;
// this package may not import dedupe, which imports it).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// apply applies the migrations in migrations/dir as pgmigrate component
// component.
func apply(ctx context.Context, db pgmigrate.DB, component, dir string) error {
	ms, err := pgmigrate.Load(migrationFS, "migrations/"+dir, nil)
	if err != nil {
		return fmt.Errorf("load migrations: %w", err)
	}
	return pgmigrate.Apply(ctx, db, component, ms)
}

package tables

// The tables of the failure index (package
// console/index): idem_dlq_records, the per-group counts idem_dlq_groups
// with the triggers that keep them, idem_dlq_versions and idem_dlq_audit.
// idem.Migrate (and `idem migrate`) run MigrateIndex, and so does
// index.Indexer.Run;
// services never call it themselves.

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// MigrateIndex creates or upgrades the index's tables; pgmigrate component
// "console-index". It is idempotent and safe when several processes start
// at once. db is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
func MigrateIndex(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}) error {
	if err := apply(ctx, db, "console-index", "index"); err != nil {
		return fmt.Errorf("index: migrate: %w", err)
	}
	return nil
}

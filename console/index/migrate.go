package index

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates or upgrades the index's tables (idem_dlq_records, the
// per-group counts idem_dlq_groups with the triggers that keep them,
// idem_dlq_versions, idem_dlq_audit); pgmigrate component "console-index".
// It is idempotent and safe when several processes start at once.
// db is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx. idem.Migrate (and
// `idem migrate`) call it.
func Migrate(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}) error {
	ms, err := pgmigrate.Load(migrationFS, "migrations", nil)
	if err != nil {
		return err
	}
	if err := pgmigrate.Apply(ctx, db, "console-index", ms); err != nil {
		return fmt.Errorf("index: migrate: %w", err)
	}
	return nil
}

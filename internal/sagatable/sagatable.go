// Package sagatable creates the tables package saga keeps its sagas in,
// idem_saga and idem_saga_step. idem.Migrate (and `idem migrate`) run it;
// services never call it themselves.
package sagatable

import (
	"context"
	"embed"
	"fmt"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates or upgrades the idem_saga and idem_saga_step tables
// (pgmigrate component "saga"). It is idempotent and safe to call from
// several processes at once.
func Migrate(ctx context.Context, db dedupe.DB) error {
	if err := pgmigrate.LoadApply(ctx, db, "saga", migrationFS, nil); err != nil {
		return fmt.Errorf("saga: migrate: %w", err)
	}
	return nil
}

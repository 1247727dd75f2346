package tables

// The tables package saga keeps its sagas in,
// idem_saga and idem_saga_step. idem.Migrate (and `idem migrate`) run MigrateSaga;
// services never call it themselves.

import (
	"context"
	"fmt"
)

// MigrateSaga creates or upgrades the idem_saga and idem_saga_step tables
// (pgmigrate component "saga"). It is idempotent and safe to call from
// several processes at once.
func MigrateSaga(ctx context.Context, db DB) error {
	if err := apply(ctx, db, "saga", "saga"); err != nil {
		return fmt.Errorf("saga: migrate: %w", err)
	}
	return nil
}

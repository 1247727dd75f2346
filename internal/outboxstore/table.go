package outboxstore

import (
	"context"
	"embed"
	"fmt"
	"hash/fnv"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/seal"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates or upgrades each outbox table of tables ("table" or
// "schema.table"; none: Table, idem_outbox), its indexes and the
// trigger that notifies the relay at commit. Each is versioned (component
// "outbox:<table>" in idem_schema_migrations), idempotent and safe when
// several processes run it at once. A bad name's error wraps
// ErrInvalidConfig.
func Migrate(ctx context.Context, db pgmigrate.DB, tables ...string) error {
	if len(tables) == 0 {
		tables = []string{Table}
	}
	for _, name := range tables {
		if name == "" {
			name = Table
		}
		n, err := Parse(name)
		if err != nil {
			return err
		}
		ms, err := pgmigrate.Load(migrationFS, "migrations", templateData(n))
		if err != nil {
			return fmt.Errorf("outbox: load migrations: %w", err)
		}
		if err := pgmigrate.Apply(ctx, db, "outbox:"+name, ms); err != nil {
			return fmt.Errorf("outbox: migrate %s: %w", n.Quoted, err)
		}
	}
	return nil
}

// Rounds is the quoted name of the table of Relay.ExactlyOnce's rounds
// that goes with outbox table n.
func Rounds(n Name) string { return Qualify(n.Schema, derived(n, "_rounds")) }

// derived names an object after table n, within PostgreSQL's 63 bytes,
// with a hash of the table name when shortened so two long names differ.
func derived(n Name, suffix string) string {
	if len(n.Rel)+len(suffix) <= 63 {
		return n.Rel + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(n.Rel))
	tail := fmt.Sprintf("_%08x%s", h.Sum32(), suffix)
	cut := 63 - len(tail)
	for cut > 0 && !utf8.RuneStart(n.Rel[cut]) {
		cut--
	}
	return n.Rel[:cut] + tail
}

// templateData is what the migrations' {{.Name}}s stand for, quoted.
func templateData(n Name) map[string]string {
	return map[string]string{
		"Table":          n.Quoted,
		"PendingIndex":   pgx.Identifier{derived(n, "_pending_idx")}.Sanitize(),
		"RetryIndex":     pgx.Identifier{derived(n, "_retry_idx")}.Sanitize(),
		"PublishedIndex": pgx.Identifier{derived(n, "_published_idx")}.Sanitize(),
		"ReadyIndex":     pgx.Identifier{derived(n, "_ready_idx")}.Sanitize(),
		"HeldIndex":      pgx.Identifier{derived(n, "_held_idx")}.Sanitize(),
		"NotifyFunc":     Qualify(n.Schema, derived(n, "_notify")),
		"Trigger":        pgx.Identifier{derived(n, "_notify_trg")}.Sanitize(),
		"Rounds":         Rounds(n),
	}
}

// Purpose is the internal/seal purpose of the data keys that seal outbox
// rows (outbox.Relay.EncryptionKeyFile), whatever their table.
const Purpose = "outbox"

// AAD binds an outbox row's sealed payload to the row: its table (as
// configured) and its event id.
func AAD(table, eventID string) []byte { return seal.AAD("outbox", table, eventID) }

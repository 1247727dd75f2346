package dedupe

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/pgmigrate"
)

// Defaults shared by the PostgreSQL stores and the Sweeper.
const (
	// defaultTable is the inbox table used when WithTable is not given.
	defaultTable = "idem_processed"
	// defaultLease is the claim duration NewPostgresLease uses when lease is 0.
	defaultLease = 5 * time.Minute
	// defaultBatchSize is Sweeper.BatchSize when zero.
	defaultBatchSize = 1000
	// defaultSweepInterval is Sweeper.Interval when zero.
	defaultSweepInterval = time.Minute
)

// Timeouts for the statements that must run even after the caller's context
// is cancelled (rollback, commit of finished work, releasing a claim).
const (
	rollbackTimeout = 5 * time.Second
	finishTimeout   = 15 * time.Second
)

// ErrInvalidConfig is wrapped by errors reporting a bad option or Sweeper
// field; the message names the field, the value and the rule.
var ErrInvalidConfig = errors.New("dedupe: invalid configuration")

//go:embed migrations/*.sql
var migrationFS embed.FS

// PostgresOption configures Postgres and PostgresLease (and their Migrate).
type PostgresOption func(*pgConfig)

type pgConfig struct {
	table string
}

// WithTable sets the inbox table. The name may be qualified as
// "schema.table": it is split at the first dot, and each part is used
// verbatim as a quoted identifier (so case, spaces and quotes are kept, and
// nothing is ever spliced into SQL unquoted). The schema must already exist.
// Each part must be 1 to 63 bytes.
//
// Default: "idem_processed" (resolved through the connection's search_path).
func WithTable(name string) PostgresOption {
	return func(c *pgConfig) { c.table = name }
}

func newPGConfig(opts []PostgresOption) pgConfig {
	c := pgConfig{table: defaultTable}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// table is a parsed, quoted inbox table name.
type table struct {
	name   string // as configured, used in the migration component name
	quoted string // "schema"."table" or "table"
	index  string // quoted, unqualified name of the processed_at index
}

func parseTable(name string) (table, error) {
	schema, rel, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, rel = "", name
	}
	if rel == "" || (qualified && schema == "") {
		return table{}, fmt.Errorf("%w: table name %q: want \"table\" or \"schema.table\" with non-empty parts", ErrInvalidConfig, name)
	}
	for _, p := range []string{schema, rel} {
		if len(p) > 63 {
			return table{}, fmt.Errorf("%w: table name %q: %q is %d bytes, PostgreSQL identifiers are at most 63", ErrInvalidConfig, name, p, len(p))
		}
		if strings.ContainsRune(p, 0) || !utf8.ValidString(p) {
			return table{}, fmt.Errorf("%w: table name %q: must be valid UTF-8 without NUL bytes", ErrInvalidConfig, name)
		}
	}
	ident := pgx.Identifier{rel}
	if qualified {
		ident = pgx.Identifier{schema, rel}
	}
	return table{name: name, quoted: ident.Sanitize(), index: pgx.Identifier{indexName(rel)}.Sanitize()}, nil
}

// indexName derives the processed_at index name from the table name, keeping
// it within 63 bytes without cutting a UTF-8 sequence, with a hash suffix when
// shortened so that two long names do not collide.
func indexName(rel string) string {
	const suffix = "_processed_at_idx"
	if len(rel)+len(suffix) <= 63 {
		return rel + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(rel))
	tail := fmt.Sprintf("_%08x%s", h.Sum32(), suffix)
	cut := 63 - len(tail)
	for cut > 0 && !utf8.RuneStart(rel[cut]) {
		cut--
	}
	return rel[:cut] + tail
}

func (t table) migrate(ctx context.Context, db pgmigrate.DB) error {
	ms, err := pgmigrate.Load(migrationFS, "migrations", struct{ Table, ProcessedAtIndex string }{t.quoted, t.index})
	if err != nil {
		return fmt.Errorf("dedupe: load migrations: %w", err)
	}
	if err := pgmigrate.Apply(ctx, db, "dedupe:"+t.name, ms); err != nil {
		return fmt.Errorf("dedupe: migrate %s: %w", t.quoted, err)
	}
	return nil
}

// rollback rolls tx back with a context that is not cancelled, so a message
// whose ctx was cancelled still releases its transaction cleanly.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_ = tx.Rollback(rctx) // on failure pgx closes the connection, which rolls back
}

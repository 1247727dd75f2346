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
	every time.Duration
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

// WithPartitions makes the inbox table range-partitioned by processed_at,
// one partition per every: 24h (a partition a day, from midnight UTC) or
// 168h (a week, from Monday midnight UTC); any other value is an error
// that Migrate and Process report. Migrate then creates the table
// partitioned, or converts a plain one without moving a row (the plain
// table becomes the oldest partition), and makes the partitions of the
// next two intervals; the Sweeper (run by consumer.Run) keeps making them
// ahead and drops every partition older than its Retention instead of
// deleting rows. It needs PostgreSQL 14 or later.
//
// A key stays a duplicate for as long as any partition holds it: the
// store takes a transaction-level advisory lock on the key, then inserts
// it only if no partition has it, in one round trip (each partition's
// primary key is one index probe). Its transactions therefore run at READ
// COMMITTED. A store without this option finds a partitioned table by
// itself and switches to that path, so members can be migrated one by one;
// docs/partitioned-inbox.md has the design, the migration and the sizing.
//
// Default: 0 (one plain table, swept by DELETE).
func WithPartitions(every time.Duration) PostgresOption {
	return func(c *pgConfig) { c.every = every }
}

func newPGConfig(opts []PostgresOption) pgConfig {
	c := pgConfig{table: defaultTable}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// table is a parsed, quoted inbox table name, and its layout.
type table struct {
	name   string        // as configured, used in the migration component name
	quoted string        // "schema"."table" or "table"
	schema string        // the schema as configured, unquoted; "": the search_path's
	rel    string        // the table's own name, unquoted
	index  string        // quoted, unqualified name of the processed_at index
	every  time.Duration // WithPartitions; 0: plain
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
	return table{name: name, quoted: ident.Sanitize(), schema: schema, rel: rel, index: pgx.Identifier{derivedName(rel, "_processed_at_idx", 63)}.Sanitize()}, nil
}

// parseConfig parses c's table and checks its options.
func parseConfig(c pgConfig) (table, error) {
	t, err := parseTable(c.table)
	if err == nil {
		err = validPartitions(c.every)
	}
	t.every = c.every
	return t, err
}

// derivedName derives the name of an object of table rel (an index, a
// partition) as rel + suffix, kept within limit bytes without cutting a
// UTF-8 sequence, with a hash of rel in it when shortened so that two long
// names do not collide.
func derivedName(rel, suffix string, limit int) string {
	if len(rel)+len(suffix) <= limit {
		return rel + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(rel))
	tail := fmt.Sprintf("_%08x%s", h.Sum32(), suffix)
	cut := limit - len(tail)
	for cut > 0 && !utf8.RuneStart(rel[cut]) {
		cut--
	}
	return rel[:cut] + tail
}

// migrate creates or upgrades the table; with WithPartitions it then
// converts it to the partitioned layout, or makes its partitions ahead.
func (t table) migrate(ctx context.Context, db DB) error {
	if err := t.migratePlain(ctx, db); err != nil {
		return err
	}
	if t.every > 0 {
		return t.partition(ctx, db, time.Time{})
	}
	return nil
}

func (t table) migratePlain(ctx context.Context, db pgmigrate.DB) error {
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

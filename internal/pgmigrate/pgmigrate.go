// Package pgmigrate is idem's tiny versioned schema migrator for PostgreSQL.
//
// Each component (for example "dedupe:idem_processed" or "outbox") owns an
// ordered list of [Migration]s. [Apply] runs, in one transaction, every
// migration of that component whose version is not yet recorded in the
// idem_schema_migrations table, in ascending version order, and records each
// one with the SHA-256 of its SQL. The transaction first takes
// pg_advisory_xact_lock([LockKey]), so several processes starting at once
// apply each migration exactly once: the others wait for the lock, then find
// nothing left to do. Apply is therefore idempotent and safe to call at every
// start-up.
//
// An applied migration is never edited: Apply refuses one whose SQL no
// longer matches the checksum recorded when it ran ([ErrChanged]), rather
// than skip it and leave the database with a schema the code no longer
// describes. A change goes into a new migration.
//
// Migrations are usually embedded SQL files named NNNN_name.sql and loaded with
// [Load], which can substitute pre-quoted identifiers through text/template so
// that user-configurable table names never reach SQL unquoted.
package pgmigrate

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"

	"github.com/jackc/pgx/v5"
)

// LockKey is the fixed pg_advisory_xact_lock key Apply holds for the length of
// its transaction ("idemmigr" read as a big-endian int64). Every idem
// component shares it, so migrations of one database are serialised.
const LockKey int64 = 0x6964656d6d696772

// TableName is the table, resolved through the connection's search_path, in
// which Apply records applied migrations. Its columns are
// (component text, version int, name text, applied_at timestamptz default
// now(), checksum text, primary key (component, version)); checksum is the
// hex SHA-256 of the migration's SQL (Checksum), NULL in rows recorded
// before idem kept checksums, until Apply next sees them.
const TableName = "idem_schema_migrations"

// DB is what Apply needs from a database handle. *pgxpool.Pool, *pgx.Conn and
// pgx.Tx (which then uses a savepoint) all satisfy it.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Migration is one versioned schema change of a component.
type Migration struct {
	// Version orders the migrations of a component; it must be positive and
	// unique within the component. Applied versions are never re-run.
	Version int
	// Name is a human-readable label recorded next to the version.
	Name string
	// SQL is executed as one simple-protocol statement list, so it may hold
	// several statements separated by semicolons. It runs inside Apply's
	// transaction and so must not contain statements that cannot run in a
	// transaction block (CREATE INDEX CONCURRENTLY, VACUUM).
	SQL string
}

// ErrInvalid is wrapped by errors Apply and Load return for bad input (empty
// component, non-positive or duplicate versions, badly named files).
var ErrInvalid = errors.New("pgmigrate: invalid migrations")

// ErrChanged is wrapped by the error Apply returns when a migration it is
// given was applied earlier with other SQL: its checksum differs from the
// one recorded then. The error names the component and every changed
// migration, and Apply applies nothing, not even the component's new
// versions.
var ErrChanged = errors.New("pgmigrate: an applied migration was changed")

const createTable = `CREATE TABLE IF NOT EXISTS ` + TableName + ` (
	component  text        NOT NULL,
	version    int         NOT NULL,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now(),
	checksum   text,
	PRIMARY KEY (component, version)
)`

// hasChecksum reports whether the table has its checksum column; a table
// made before idem kept checksums has not, and Apply adds it.
const hasChecksum = `SELECT EXISTS (SELECT 1 FROM pg_attribute
	WHERE attrelid = '` + TableName + `'::regclass AND attname = 'checksum' AND NOT attisdropped)`

const addChecksum = `ALTER TABLE ` + TableName + ` ADD COLUMN IF NOT EXISTS checksum text`

// Checksum is the hex SHA-256 of m's SQL, as Apply records it.
func Checksum(m Migration) string {
	sum := sha256.Sum256([]byte(m.SQL))
	return hex.EncodeToString(sum[:])
}

// Apply brings component up to date: in one transaction holding
// pg_advisory_xact_lock(LockKey) it creates the idem_schema_migrations table if
// needed (and adds its checksum column to one made before checksums), then
// checks the migrations already recorded for component, then runs every
// migration whose version is not yet recorded, in ascending version order,
// recording each with its Checksum.
//
// A recorded migration whose checksum differs from its SQL's makes Apply
// fail with an error wrapping ErrChanged, before it runs anything; a
// recorded migration without a checksum (applied before idem kept them)
// takes its current one. If any migration fails the whole transaction rolls
// back, nothing is recorded, and the error names the failing version.
// Calling Apply again, or from several processes at once, is safe:
// already-applied versions are skipped.
func Apply(ctx context.Context, db DB, component string, migrations []Migration) (err error) {
	if err := validate(component, migrations); err != nil {
		return err
	}
	sorted := slices.Clone(migrations)
	slices.SortFunc(sorted, func(a, b Migration) int { return a.Version - b.Version })

	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgmigrate: %s: begin: %w", component, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", LockKey); err != nil {
		return fmt.Errorf("pgmigrate: %s: take advisory lock: %w", component, err)
	}
	if _, err := tx.Exec(ctx, createTable); err != nil {
		return fmt.Errorf("pgmigrate: create %s: %w", TableName, err)
	}
	var ok bool
	if err := tx.QueryRow(ctx, hasChecksum).Scan(&ok); err != nil {
		return fmt.Errorf("pgmigrate: %s: read the columns of %s: %w", component, TableName, err)
	}
	if !ok {
		if _, err := tx.Exec(ctx, addChecksum); err != nil {
			return fmt.Errorf("pgmigrate: %s: add the checksum column to %s: %w", component, TableName, err)
		}
	}
	rows, err := tx.Query(ctx, "SELECT version, checksum FROM "+TableName+" WHERE component = $1", component)
	if err != nil {
		return fmt.Errorf("pgmigrate: %s: read applied versions: %w", component, err)
	}
	type recorded struct {
		Version  int32
		Checksum *string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[recorded])
	if err != nil {
		return fmt.Errorf("pgmigrate: %s: read applied versions: %w", component, err)
	}
	applied := make(map[int]*string, len(got))
	for _, r := range got {
		applied[int(r.Version)] = r.Checksum
	}
	// Check every recorded migration before running any.
	var changed, adopt []Migration
	for _, m := range sorted {
		sum, ok := applied[m.Version]
		switch {
		case !ok:
		case sum == nil:
			adopt = append(adopt, m)
		case *sum != Checksum(m):
			changed = append(changed, m)
		}
	}
	if len(changed) > 0 {
		names := make([]string, len(changed))
		for i, m := range changed {
			names[i] = fmt.Sprintf("%04d_%s (recorded sha256 %.12s…, now %.12s…)", m.Version, m.Name, *applied[m.Version], Checksum(m))
		}
		return fmt.Errorf("%w: component %s: migration %s applied earlier with other SQL, so the schema may not be what it now says; nothing was applied. "+
			"Put a change in a new migration, never in an applied one. If the schema does match the new SQL, "+
			"clear the recorded checksum (UPDATE %s SET checksum = NULL WHERE component = '%s' AND version = %d) and the next Apply takes the new one",
			ErrChanged, component, strings.Join(names, ", "), TableName, strings.ReplaceAll(component, "'", "''"), changed[0].Version)
	}
	for _, m := range adopt {
		if _, err := tx.Exec(ctx,
			"UPDATE "+TableName+" SET checksum = $3 WHERE component = $1 AND version = $2 AND checksum IS NULL",
			component, m.Version, Checksum(m)); err != nil {
			return fmt.Errorf("pgmigrate: %s: record the checksum of migration %04d_%s: %w", component, m.Version, m.Name, err)
		}
	}
	for _, m := range sorted {
		if _, ok := applied[m.Version]; ok {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("pgmigrate: %s: migration %04d_%s: %w", component, m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx,
			"INSERT INTO "+TableName+" (component, version, name, checksum) VALUES ($1, $2, $3, $4)",
			component, m.Version, m.Name, Checksum(m)); err != nil {
			return fmt.Errorf("pgmigrate: %s: record migration %04d_%s: %w", component, m.Version, m.Name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgmigrate: %s: commit: %w", component, err)
	}
	return nil
}

func validate(component string, migrations []Migration) error {
	if component == "" {
		return fmt.Errorf("%w: component is empty", ErrInvalid)
	}
	seen := make(map[int]bool, len(migrations))
	for _, m := range migrations {
		if m.Version <= 0 || m.Version > 1<<31-1 {
			return fmt.Errorf("%w: %s: migration %q has version %d, want 1..2147483647", ErrInvalid, component, m.Name, m.Version)
		}
		if seen[m.Version] {
			return fmt.Errorf("%w: %s: version %d appears twice", ErrInvalid, component, m.Version)
		}
		seen[m.Version] = true
	}
	return nil
}

var fileName = regexp.MustCompile(`^([0-9]+)_([A-Za-z0-9_.-]+)\.sql$`)

// Load reads the migrations in directory dir of fsys (typically an embed.FS).
// Every file ending in ".sql" must be named NNNN_name.sql, where NNNN is the
// decimal version (leading zeros allowed) and name a label of letters, digits,
// '_', '-' and '.'; other files are ignored. The result is sorted by version.
//
// If data is not nil each file is executed as a text/template with data (for
// example {{.Table}}); a reference to a missing key is an error. Substituted
// values are inserted verbatim, so they must already be quoted identifiers,
// such as the output of pgx.Identifier.Sanitize or [QuoteIdentifier]. If data
// is nil the files are used as they are.
func Load(fsys fs.FS, dir string, data any) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("pgmigrate: read %s: %w", dir, err)
	}
	var out []Migration
	seen := map[int]string{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("%w: file %q: want a name like 0001_create_table.sql", ErrInvalid, e.Name())
		}
		version, err := strconv.Atoi(m[1])
		if err != nil || version <= 0 || version > 1<<31-1 {
			return nil, fmt.Errorf("%w: file %q: version must be 1..2147483647", ErrInvalid, e.Name())
		}
		if prev, dup := seen[version]; dup {
			return nil, fmt.Errorf("%w: files %q and %q share version %d", ErrInvalid, prev, e.Name(), version)
		}
		seen[version] = e.Name()
		p := path.Join(dir, e.Name())
		raw, err := fs.ReadFile(fsys, p)
		if err != nil {
			return nil, fmt.Errorf("pgmigrate: read %s: %w", p, err)
		}
		sql := string(raw)
		if data != nil {
			t, err := template.New(e.Name()).Option("missingkey=error").Parse(sql)
			if err != nil {
				return nil, fmt.Errorf("pgmigrate: parse template %s: %w", p, err)
			}
			var b strings.Builder
			if err := t.Execute(&b, data); err != nil {
				return nil, fmt.Errorf("pgmigrate: execute template %s: %w", p, err)
			}
			sql = b.String()
		}
		out = append(out, Migration{Version: version, Name: m[2], SQL: sql})
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

// QuoteIdentifier quotes each part of a possibly qualified name (for example
// {"schema", "table"}) for use as an SQL identifier; it is
// pgx.Identifier(parts).Sanitize().
func QuoteIdentifier(parts ...string) string {
	return pgx.Identifier(parts).Sanitize()
}

// LoadApply loads the migrations in fsys's "migrations" directory (Load,
// with data) and applies them as component (Apply): the whole migration of
// a component whose SQL is embedded next to it.
func LoadApply(ctx context.Context, db DB, component string, fsys fs.FS, data any) error {
	ms, err := Load(fsys, "migrations", data)
	if err != nil {
		return fmt.Errorf("load migrations: %w", err)
	}
	return Apply(ctx, db, component, ms)
}

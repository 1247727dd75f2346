package idem_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/control"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// catalog describes what a schema holds: each table with its columns, each
// index and each trigger, one line each, sorted, with the schema's name
// left out so that two schemas compare.
func catalog(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	return column(t, pool, `
		SELECT 'table ' || c.table_name || ' ' || string_agg(c.column_name || ':' || c.data_type || ':' || c.is_nullable, ',' ORDER BY c.column_name)
		  FROM information_schema.columns c WHERE c.table_schema = $1 GROUP BY c.table_name
		UNION ALL
		SELECT 'index ' || tablename || ' ' || indexname || ' ' || replace(indexdef, quote_ident($1) || '.', '')
		  FROM pg_indexes WHERE schemaname = $1
		UNION ALL
		SELECT 'trigger ' || event_object_table || ' ' || trigger_name || ' ' || event_manipulation || ' ' || action_timing
		  FROM information_schema.triggers WHERE trigger_schema = $1
		ORDER BY 1`, schema)
}

// applied returns the migrations idem_schema_migrations records, as
// "component version name".
func applied(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	return column(t, pool, `SELECT component || ' ' || version || ' ' || name FROM idem_schema_migrations ORDER BY 1`)
}

// column returns the one text column of a query's rows.
func column(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// migrationFiles returns the name part of every versioned SQL file of the
// module's packages (NNNN_name.sql under a migrations folder), examples and
// other modules left out.
func migrationFiles(t *testing.T) []string {
	t.Helper()
	file := regexp.MustCompile(`^\d+_(.+)\.sql$`)
	var out []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "examples" || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if m := file.FindStringSubmatch(d.Name()); m != nil && slices.Contains(strings.Split(filepath.ToSlash(filepath.Dir(path)), "/"), "migrations") {
			out = append(out, m[1])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

// TestMigrateCreatesEveryTable: on a fresh schema idem.Migrate creates what
// every package's own migration creates, no more and no less; it applies
// every versioned SQL file of the module; and running it again, or from
// several processes at once, changes nothing.
func TestMigrateCreatesEveryTable(t *testing.T) {
	testenv.SkipIfShort(t)
	ctx := testenv.Context(t)

	union, unionSchema := testenv.PostgresSchema(t)
	for _, step := range []func() error{
		func() error { return dedupe.NewPostgres(union).Migrate(ctx) },
		func() error { return keyorder.New(union, "").Migrate(ctx) },
		func() error { return outboxstore.Migrate(ctx, union) },
		func() error { return tables.MigrateSaga(ctx, union) },
		func() error { return tables.MigrateCheckpoint(ctx, union) },
		func() error { return tables.MigrateIndex(ctx, union) },
		func() error { return tables.MigrateDeferred(ctx, union) },
		func() error { return tables.MigrateSteps(ctx, union) },
		func() error { return seal.Migrate(ctx, union) },
		func() error { return control.Migrate(ctx, union) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	want := catalog(t, union, unionSchema)

	pool, schema := testenv.PostgresSchema(t)
	if err := idem.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	got := catalog(t, pool, schema)
	if !slices.Equal(got, want) {
		t.Fatalf("idem.Migrate created\n  %s\nthe packages' own migrations\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	for _, table := range []string{"idem_processed", "idem_ordering_heads", "idem_ordering_parked", "idem_outbox", "idem_saga", "idem_saga_step",
		"idem_checkpoint", "idem_dlq_records", "idem_dlq_groups", "idem_dlq_versions", "idem_dlq_audit", "idem_deferred", "idem_steps", "idem_seal_keys",
		"idem_control_pauses", "idem_control_redrives", "idem_control_redrive_parts", "idem_control_members", "idem_schema_migrations"} {
		if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "table "+table+" ") }) {
			t.Errorf("no table %s", table)
		}
	}

	// Every migration file of the module, once: a package that adds
	// migrations of its own must be a step of idem.Migrate.
	first := applied(t, pool)
	var names []string
	for _, a := range first {
		names = append(names, a[strings.LastIndexByte(a, ' ')+1:])
	}
	slices.Sort(names)
	if files := migrationFiles(t); !slices.Equal(names, files) {
		t.Fatalf("idem.Migrate applied %v; the module's migration files are %v", names, files)
	}

	// Again, and three at once: nothing new.
	if err := idem.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for range 3 {
		wg.Go(func() { errs <- idem.Migrate(ctx, pool) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	if again := applied(t, pool); !slices.Equal(again, first) {
		t.Fatalf("a second Migrate applied more: %v, then %v", first, again)
	}
	if again := catalog(t, pool, schema); !slices.Equal(again, got) {
		t.Fatalf("a second Migrate changed the schema:\n  %s", strings.Join(again, "\n  "))
	}
}

// TestMigrateTableNames: Inbox (dedupe.WithTable) and OutboxTable name the tables Migrate
// creates, schema-qualified or not.
func TestMigrateTableNames(t *testing.T) {
	testenv.SkipIfShort(t)
	ctx := testenv.Context(t)
	pool, schema := testenv.PostgresSchema(t)
	other, _ := testenv.PostgresSchema(t)
	var otherSchema string
	if err := other.QueryRow(ctx, `SELECT current_schema()`).Scan(&otherSchema); err != nil {
		t.Fatal(err)
	}
	err := idem.Migrate(ctx, pool, idem.Inbox(dedupe.WithTable("billing_inbox")),
		idem.OutboxTable("billing_events"), idem.OutboxTable(otherSchema+".audit_events"))
	if err != nil {
		t.Fatal(err)
	}
	tables := func(schema string) []string {
		var out []string
		for _, line := range catalog(t, pool, schema) {
			if f := strings.Fields(line); f[0] == "table" {
				out = append(out, f[1])
			}
		}
		return out
	}
	got := tables(schema)
	for _, want := range []string{"billing_inbox", "billing_events"} {
		if !slices.Contains(got, want) {
			t.Errorf("no table %s in %v", want, got)
		}
	}
	for _, absent := range []string{"idem_processed", "idem_outbox"} {
		if slices.Contains(got, absent) {
			t.Errorf("default table %s created beside the named one", absent)
		}
	}
	if got := tables(otherSchema); !slices.Contains(got, "audit_events") {
		t.Errorf("no table audit_events in schema %s: %v", otherSchema, got)
	}
	if err := idem.Migrate(ctx, pool, idem.Inbox(dedupe.WithTable("no such schema.x.y"))); err == nil || !strings.Contains(err.Error(), "idem: migrate inbox") {
		t.Errorf("an invalid inbox name: %v", err)
	}
}

// TestNothingImportsTheRoot: package idem is the composition root; no
// library package of the module imports it, in its code or its tests
// (commands and examples may).
func TestNothingImportsTheRoot(t *testing.T) {
	out, err := exec.Command("go", "list", "-json=ImportPath,Name,Imports,TestImports,XTestImports", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	const root = "github.com/idemhq/idem"
	seen := 0
	for dec.More() {
		var p struct {
			ImportPath, Name                   string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		seen++
		if p.ImportPath == root || p.Name == "main" || strings.HasPrefix(p.ImportPath, root+"/examples/") {
			continue
		}
		for _, imp := range slices.Concat(p.Imports, p.TestImports, p.XTestImports) {
			if imp == root {
				t.Errorf("%s imports %s: only commands and examples may", p.ImportPath, root)
			}
		}
	}
	if seen < 10 {
		t.Fatalf("go list gave %d packages", seen)
	}
}

func ExampleMigrate() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	// Every table idem keeps; safe at every start of every replica.
	if err := idem.Migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	// Or with tables of other names (the schema must exist).
	if err := idem.Migrate(ctx, pool, idem.Inbox(dedupe.WithTable("billing.idem_processed")), idem.OutboxTable("billing.events")); err != nil {
		fmt.Println(err)
	}
}

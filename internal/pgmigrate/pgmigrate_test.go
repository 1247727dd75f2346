package pgmigrate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/pgmigrate"
	"github.com/idemhq/idem/internal/testing/testenv"
)

var (
	_ pgmigrate.DB = (*pgxpool.Pool)(nil)
	_ pgmigrate.DB = (*pgx.Conn)(nil)
	_ pgmigrate.DB = pgx.Tx(nil)
)

// The tests take their schema from testenv.Postgres, not
// idemtest.ConnectPostgres: they need it empty (no idem_schema_migrations),
// and idemtest's comes with idem's tables.

// nonIdempotent fails if it is run twice: CREATE TABLE without IF NOT EXISTS.
var nonIdempotent = []pgmigrate.Migration{
	{Version: 1, Name: "create_a", SQL: "CREATE TABLE a (id int PRIMARY KEY)"},
	{Version: 2, Name: "create_b", SQL: "CREATE TABLE b (id int); INSERT INTO a VALUES (1)"},
}

type appliedRow struct {
	Component string
	Version   int32
	Name      string
	AppliedAt time.Time
}

func applied(tb testing.TB, db *pgxpool.Pool) []appliedRow {
	tb.Helper()
	rows, err := db.Query(tb.Context(),
		"SELECT component, version, name, applied_at FROM idem_schema_migrations ORDER BY component, version")
	if err != nil {
		tb.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[appliedRow])
	if err != nil {
		tb.Fatal(err)
	}
	return got
}

func TestApplyRecordsInOrder(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	// Given out of order: Apply must sort (b's INSERT needs a).
	ms := []pgmigrate.Migration{nonIdempotent[1], nonIdempotent[0]}
	if err := pgmigrate.Apply(ctx, db, "comp", ms); err != nil {
		t.Fatal(err)
	}
	got := applied(t, db)
	if len(got) != 2 || got[0].Version != 1 || got[0].Name != "create_a" || got[1].Version != 2 || got[1].Name != "create_b" {
		t.Fatalf("applied = %+v", got)
	}
}

func TestApplyTwiceIsNoOp(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	if err := pgmigrate.Apply(ctx, db, "comp", nonIdempotent); err != nil {
		t.Fatal(err)
	}
	before := applied(t, db)
	if err := pgmigrate.Apply(ctx, db, "comp", nonIdempotent); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	after := applied(t, db)
	if len(after) != len(before) {
		t.Fatalf("rows changed: before %+v after %+v", before, after)
	}
	for i := range before {
		if !before[i].AppliedAt.Equal(after[i].AppliedAt) {
			t.Fatalf("version %d re-recorded", before[i].Version)
		}
	}
	var n int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM a").Scan(&n); err != nil || n != 1 {
		t.Fatalf("a has %d rows (err %v), want 1", n, err)
	}
}

func TestApplyIncremental(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	if err := pgmigrate.Apply(ctx, db, "comp", nonIdempotent[:1]); err != nil {
		t.Fatal(err)
	}
	if err := pgmigrate.Apply(ctx, db, "comp", nonIdempotent); err != nil {
		t.Fatalf("apply with one new version: %v", err)
	}
	if got := applied(t, db); len(got) != 2 {
		t.Fatalf("applied = %+v", got)
	}
}

func TestApplyConcurrentPools(t *testing.T) {
	db, schema := testenv.PostgresSchema(t)
	ctx := t.Context()
	pools := []*pgxpool.Pool{db, testenv.PoolOnSchema(t, schema), testenv.PoolOnSchema(t, schema)}
	var wg sync.WaitGroup
	errs := make([]error, len(pools))
	start := make(chan struct{})
	for i, p := range pools {
		wg.Go(func() {
			<-start
			errs[i] = pgmigrate.Apply(ctx, p, "comp", nonIdempotent)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Apply %d: %v", i, err)
		}
	}
	if got := applied(t, db); len(got) != 2 {
		t.Fatalf("applied = %+v", got)
	}
}

func TestApplyFailureRollsBackEverything(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	ms := []pgmigrate.Migration{
		nonIdempotent[0],
		{Version: 2, Name: "broken", SQL: "CREATE TABLE oops ("},
	}
	err := pgmigrate.Apply(ctx, db, "comp", ms)
	if err == nil {
		t.Fatal("Apply with broken SQL: nil error")
	}
	// The whole transaction rolled back: not even the bookkeeping table exists.
	for _, table := range []string{"a", "idem_schema_migrations"} {
		var exists bool
		if err := db.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil || exists {
			t.Fatalf("table %s exists=%v (err %v) after rolled back Apply", table, exists, err)
		}
	}
}

// TestApplyRefusesAChangedMigration: a migration whose SQL changed after it
// was applied makes Apply fail with ErrChanged, naming the component and
// the migration, and apply nothing, not even a new version given with it.
func TestApplyRefusesAChangedMigration(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	if err := pgmigrate.Apply(ctx, db, "comp", nonIdempotent[:1]); err != nil {
		t.Fatal(err)
	}
	before := applied(t, db)
	edited := []pgmigrate.Migration{
		{Version: 1, Name: "create_a", SQL: "CREATE TABLE a (id int PRIMARY KEY, note text)"},
		nonIdempotent[1],
	}
	err := pgmigrate.Apply(ctx, db, "comp", edited)
	if !errors.Is(err, pgmigrate.ErrChanged) {
		t.Fatalf("Apply of an edited migration: %v, want ErrChanged", err)
	}
	for _, want := range []string{"comp", "0001_create_a", pgmigrate.Checksum(nonIdempotent[0])[:12], pgmigrate.Checksum(edited[0])[:12]} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if after := applied(t, db); len(after) != len(before) {
		t.Fatalf("applied %+v after the refusal, want %+v", after, before)
	}
	var exists bool
	if err := db.QueryRow(ctx, "SELECT to_regclass('b') IS NOT NULL").Scan(&exists); err != nil || exists {
		t.Fatalf("table b exists=%v (err %v): the new version ran beside a changed one", exists, err)
	}
	// The migration as it was applied still passes, and so does the new one.
	if err := pgmigrate.Apply(ctx, db, "comp", nonIdempotent); err != nil {
		t.Fatalf("Apply of the original migrations: %v", err)
	}
	// Another component's version 1 is not concerned.
	if err := pgmigrate.Apply(ctx, db, "other", []pgmigrate.Migration{{Version: 1, Name: "create_c", SQL: "CREATE TABLE c (id int)"}}); err != nil {
		t.Fatalf("Apply of another component: %v", err)
	}
}

// TestApplyAdoptsRowsWithoutChecksum: on a table made before checksums
// (no checksum column), Apply adds the column, gives the recorded
// migrations their current checksum, applies the new ones, and from then on
// refuses an edit.
func TestApplyAdoptsRowsWithoutChecksum(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	// The table and row as an idem without checksums left them.
	if _, err := db.Exec(ctx, `CREATE TABLE idem_schema_migrations (
		component  text        NOT NULL,
		version    int         NOT NULL,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (component, version));
		CREATE TABLE a (id int PRIMARY KEY);
		INSERT INTO idem_schema_migrations (component, version, name) VALUES ('comp', 1, 'create_a')`); err != nil {
		t.Fatal(err)
	}
	if err := pgmigrate.Apply(ctx, db, "comp", nonIdempotent); err != nil {
		t.Fatalf("Apply on a table without checksums: %v", err)
	}
	rows, err := db.Query(ctx, "SELECT version, checksum FROM idem_schema_migrations WHERE component = 'comp' ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Version  int32
		Checksum string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		t.Fatal(err)
	}
	want := []row{{1, pgmigrate.Checksum(nonIdempotent[0])}, {2, pgmigrate.Checksum(nonIdempotent[1])}}
	if !slices.Equal(got, want) {
		t.Fatalf("recorded %+v, want %+v", got, want)
	}
	var n int
	if err := db.QueryRow(ctx, "SELECT count(*) FROM a").Scan(&n); err != nil || n != 1 {
		t.Fatalf("a has %d rows (err %v): version 2 did not run once", n, err)
	}
	edited := []pgmigrate.Migration{{Version: 1, Name: "create_a", SQL: "CREATE TABLE a (id bigint PRIMARY KEY)"}}
	if err := pgmigrate.Apply(ctx, db, "comp", edited); !errors.Is(err, pgmigrate.ErrChanged) {
		t.Fatalf("Apply of an edited migration after adoption: %v, want ErrChanged", err)
	}
}

func TestApplyComponentsAreIndependent(t *testing.T) {
	db := testenv.Postgres(t)
	ctx := t.Context()
	if err := pgmigrate.Apply(ctx, db, "one", []pgmigrate.Migration{{Version: 1, Name: "x", SQL: "CREATE TABLE x (id int)"}}); err != nil {
		t.Fatal(err)
	}
	if err := pgmigrate.Apply(ctx, db, "two", []pgmigrate.Migration{{Version: 1, Name: "y", SQL: "CREATE TABLE y (id int)"}}); err != nil {
		t.Fatal(err)
	}
	if got := applied(t, db); len(got) != 2 || got[0].Component != "one" || got[1].Component != "two" {
		t.Fatalf("applied = %+v", got)
	}
}

func TestApplyWithConn(t *testing.T) {
	_, schema := testenv.PostgresSchema(t)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := pgmigrate.Apply(ctx, conn, "comp", nonIdempotent); err != nil {
		t.Fatal(err)
	}
}

func TestApplyRejectsBadInput(t *testing.T) {
	cases := map[string]struct {
		component string
		ms        []pgmigrate.Migration
	}{
		"empty component":   {"", nonIdempotent},
		"zero version":      {"c", []pgmigrate.Migration{{Version: 0, Name: "z", SQL: "SELECT 1"}}},
		"negative version":  {"c", []pgmigrate.Migration{{Version: -1, Name: "z", SQL: "SELECT 1"}}},
		"duplicate version": {"c", []pgmigrate.Migration{{Version: 1, Name: "a", SQL: "SELECT 1"}, {Version: 1, Name: "b", SQL: "SELECT 1"}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			// Validation happens before any database access: a nil DB is fine.
			err := pgmigrate.Apply(context.Background(), nil, tc.component, tc.ms)
			if !errors.Is(err, pgmigrate.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_index.sql":  {Data: []byte("CREATE INDEX ON {{.Table}} (id)")},
		"m/0001_create.sql": {Data: []byte("CREATE TABLE {{.Table}} (id int)")},
		"m/README.md":       {Data: []byte("ignored")},
	}
	ms, err := pgmigrate.Load(fsys, "m", struct{ Table string }{pgmigrate.QuoteIdentifier("s", `we"ird`)})
	if err != nil {
		t.Fatal(err)
	}
	want := []pgmigrate.Migration{
		{Version: 1, Name: "create", SQL: `CREATE TABLE "s"."we""ird" (id int)`},
		{Version: 2, Name: "index", SQL: `CREATE INDEX ON "s"."we""ird" (id)`},
	}
	if len(ms) != len(want) {
		t.Fatalf("got %+v", ms)
	}
	for i := range want {
		if ms[i] != want[i] {
			t.Errorf("migration %d = %+v, want %+v", i, ms[i], want[i])
		}
	}

	raw, err := pgmigrate.Load(fsys, "m", nil)
	if err != nil || raw[0].SQL != "CREATE TABLE {{.Table}} (id int)" {
		t.Fatalf("Load without data = %+v, %v", raw, err)
	}
}

func TestLoadErrors(t *testing.T) {
	cases := map[string]fstest.MapFS{
		"bad name":     {"m/create.sql": {Data: []byte("x")}},
		"zero version": {"m/0000_x.sql": {Data: []byte("x")}},
		"duplicate":    {"m/0001_a.sql": {Data: []byte("x")}, "m/1_b.sql": {Data: []byte("x")}},
	}
	for name, fsys := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := pgmigrate.Load(fsys, "m", nil); !errors.Is(err, pgmigrate.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
	t.Run("missing key", func(t *testing.T) {
		fsys := fstest.MapFS{"m/0001_a.sql": {Data: []byte("{{.Nope}}")}}
		if _, err := pgmigrate.Load(fsys, "m", map[string]string{"Table": "x"}); err == nil {
			t.Fatal("missing template key: nil error")
		}
	})
}

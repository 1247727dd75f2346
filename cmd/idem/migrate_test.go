package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idemroot "github.com/idemhq/idem"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestMigrate runs `idem migrate` twice against a fresh schema: the tables
// appear, and the second run is a no-op.
func TestMigrate(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	_, schema := testenv.PostgresSchema(t)
	table := schema + ".inbox"
	for i := range 2 {
		var out, errOut strings.Builder
		if code := run([]string{"migrate", "--database-url", url, "--table", table}, strings.NewReader(""), &out, &errOut); code != 0 {
			t.Fatalf("run %d: exit %d: %s", i, code, errOut.String())
		}
		if !strings.Contains(out.String(), "schema up to date") {
			t.Fatalf("output %q", out.String())
		}
	}
	c, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	var n int
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM information_schema.tables WHERE table_schema=$1 AND table_name='inbox'`, schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("inbox table: n=%d err=%v", n, err)
	}
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM information_schema.tables WHERE table_name='idem_ordering_parked'`).Scan(&n); err != nil || n < 1 {
		t.Fatalf("ordering table: n=%d err=%v", n, err)
	}
	var out, errOut strings.Builder
	if code := run([]string{"migrate", "--database-url", ""}, strings.NewReader(""), &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "DATABASE_URL") {
		t.Fatalf("no URL: exit %d, %q", code, errOut.String())
	}
}

// TestMigrateIsIdemMigrate: `idem migrate` on a fresh schema applies the
// same migrations as idem.Migrate on another, outbox tables of other names
// included.
func TestMigrateIsIdemMigrate(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	url := testenv.DatabaseURL(t)
	cli, cliSchema := testenv.PostgresSchema(t)
	lib, _ := testenv.PostgresSchema(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	var out, errOut strings.Builder
	if code := run([]string{"migrate", "--database-url", url + sep + "search_path=" + cliSchema, "--outbox-table", "events", "--outbox-table", "audit"},
		strings.NewReader(""), &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if err := idemroot.Migrate(ctx, lib, idemroot.OutboxTable("events"), idemroot.OutboxTable("audit")); err != nil {
		t.Fatal(err)
	}
	applied := func(pool *pgxpool.Pool) []string {
		rows, err := pool.Query(ctx, `SELECT component || ' ' || version FROM idem_schema_migrations ORDER BY 1`)
		if err != nil {
			t.Fatal(err)
		}
		got, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	got, want := applied(cli), applied(lib)
	if !slices.Equal(got, want) || !slices.Contains(got, "outbox:audit 1") {
		t.Fatalf("idem migrate applied %v; idem.Migrate %v", got, want)
	}
}

// TestMigratePartitionedInbox: `idem migrate --partitioned-inbox` converts
// the plain inbox of an earlier `idem migrate`, rows and all, into a
// partitioned one; a second run is a no-op, and a width other than day or
// week is refused.
func TestMigratePartitionedInbox(t *testing.T) {
	t.Parallel()
	ctx := testenv.Context(t)
	url := testenv.DatabaseURL(t)
	db, schema := testenv.PostgresSchema(t)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	url += sep + "search_path=" + schema
	migrate := func(args ...string) (int, string) {
		var out, errOut strings.Builder
		code := run(append([]string{"migrate", "--database-url", url}, args...), strings.NewReader(""), &out, &errOut)
		return code, errOut.String()
	}
	if code, errOut := migrate(); code != 0 {
		t.Fatalf("plain: exit %d: %s", code, errOut)
	}
	if _, err := db.Exec(ctx, `INSERT INTO idem_processed (consumer_group, idempotency_key) SELECT 'g', 'k' || i FROM generate_series(1, 100) i`); err != nil {
		t.Fatal(err)
	}
	if code, errOut := migrate("--partitioned-inbox=month"); code != 1 || !strings.Contains(errOut, "day or week") {
		t.Fatalf("--partitioned-inbox=month: exit %d, %q", code, errOut)
	}
	for i := range 2 {
		if code, errOut := migrate("--partitioned-inbox"); code != 0 {
			t.Fatalf("run %d: exit %d: %s", i, code, errOut)
		}
	}
	var kind string
	var rows, parts int
	if err := db.QueryRow(ctx, `SELECT relkind::text, (SELECT count(*) FROM idem_processed),
		(SELECT count(*) FROM pg_inherits WHERE inhparent = 'idem_processed'::regclass)
		FROM pg_class WHERE oid = 'idem_processed'::regclass`).Scan(&kind, &rows, &parts); err != nil {
		t.Fatal(err)
	}
	if kind != "p" || rows != 100 || parts < 2 {
		t.Fatalf("after --partitioned-inbox: relkind %q, %d rows, %d partitions; want p, 100, at least 2 (the plain table and one ahead)", kind, rows, parts)
	}
}

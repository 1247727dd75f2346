package main

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/testenv"
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

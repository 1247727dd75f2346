package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/checkpoint"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
)

func TestCheckpointCLI(t *testing.T) {
	t.Parallel()
	pool, schema := testenv.PostgresSchema(t)
	ctx := testenv.Context(t)
	db := schemaURL(t, schema)
	cli := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		code := run(append(args, "--database-url", db), strings.NewReader(stdin), &out, &errOut)
		t.Logf("idem %s -> %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		return code, out.String(), errOut.String()
	}
	if code, _, errOut := cli("", "checkpoint", "status"); code != 1 || !strings.Contains(errOut, "idem migrate") {
		t.Fatalf("status without the table: %d %q; want the fix named", code, errOut)
	}
	if err := tables.MigrateCheckpoint(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := cli("", "checkpoint", "status"); code != 0 || !strings.Contains(out, "no checkpoints") {
		t.Fatalf("status of nothing: %d %q", code, out)
	}
	// A job of 25 rows in chunks of 10.
	r, err := checkpoint.NewRunner(checkpoint.Job[int]{Name: "nightly", ChunkSize: 10,
		Read: func(ctx context.Context, tx pgx.Tx, after string, limit int) ([]int, string, error) {
			var ids []int
			rows, err := tx.Query(ctx, `SELECT g FROM generate_series(1, 25) g WHERE g > coalesce(nullif($1, '')::int, 0) ORDER BY g LIMIT $2`, after, limit)
			if err != nil {
				return nil, "", err
			}
			if ids, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil || len(ids) == 0 {
				return nil, after, err
			}
			return ids, strconv.Itoa(ids[len(ids)-1]), nil
		},
		Process: func(context.Context, pgx.Tx, []int) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(ctx, pool); err != nil {
		t.Fatal(err)
	}
	code, out, _ := cli("", "checkpoint", "status")
	if code != 0 || !strings.Contains(out, "nightly") || !strings.Contains(out, `"25"`) || !strings.Contains(out, "  25  ") {
		t.Fatalf("status: %d %q", code, out)
	}
	code, out, _ = cli("", "checkpoint", "status", "nightly", "--json")
	var states []tables.Checkpoint
	if err := json.Unmarshal([]byte(out), &states); code != 0 || err != nil || len(states) != 1 || states[0].Cursor != "25" || states[0].Chunks != 3 || states[0].FinishedAt.IsZero() {
		t.Fatalf("status --json: %d %v %+v", code, err, states)
	}
	// reset asks; "n" changes nothing
	if code, _, errOut := cli("n\n", "checkpoint", "reset", "nightly"); code != 1 || !strings.Contains(errOut, "not confirmed") {
		t.Fatalf("unconfirmed reset: %d %q", code, errOut)
	}
	if s, _ := tables.GetCheckpoint(ctx, pool, "nightly"); s.Cursor != "25" {
		t.Fatalf("unconfirmed reset moved the cursor to %q", s.Cursor)
	}
	if code, out, _ := cli("y\n", "checkpoint", "reset", "nightly", "--to", "20"); code != 0 || !strings.Contains(out, `"25" -> "20"`) {
		t.Fatalf("reset --to 20: %d %q", code, out)
	}
	if st, err := r.Run(ctx, pool); err != nil || st.Rows != 5 {
		t.Fatalf("Run after reset: %+v, %v; want the 5 rows after 20", st, err)
	}
	if code, _, _ := cli("", "checkpoint", "reset", "nightly", "--yes"); code != 0 {
		t.Fatal("reset --yes failed")
	}
	if st, err := r.Run(ctx, pool); err != nil || st.Rows != 25 {
		t.Fatalf("Run after reset to the start: %+v, %v", st, err)
	}
	for _, args := range [][]string{
		{"checkpoint", "status", "missing"},
		{"checkpoint", "reset", "missing", "--yes"},
		{"checkpoint", "reset"},
	} {
		if code, _, errOut := cli("", args...); code != 1 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q; want an error", args, code, errOut)
		}
	}
}

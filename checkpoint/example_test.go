package checkpoint_test

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/checkpoint"
)

// A job over a table with a bigint key: the cursor is the last id. This
// read is correct only for a table no one inserts into while the job runs
// (here: orders of a closed month); see LiveTable otherwise.
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://…")
	// idem.Migrate(ctx, pool) has created idem_checkpoint with idem's other tables.
	r, _ := checkpoint.NewRunner(checkpoint.Job[int64]{
		Name: "archive-orders",
		Read: func(ctx context.Context, tx pgx.Tx, after string, limit int) ([]int64, string, error) {
			from, _ := strconv.ParseInt(after, 10, 64) // "" → 0: the start
			rows, _ := tx.Query(ctx, `SELECT id FROM orders WHERE id > $1 ORDER BY id LIMIT $2`, from, limit)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil || len(ids) == 0 {
				return nil, after, err
			}
			return ids, strconv.FormatInt(ids[len(ids)-1], 10), nil
		},
		Process: func(ctx context.Context, tx pgx.Tx, ids []int64) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders_archive SELECT * FROM orders WHERE id = ANY($1)`, ids)
			return err
		},
	})
	_, _ = r.Run(ctx, pool) // resumes after the last committed chunk
}

// A job over a table written while it runs: LiveTable reads in commit-safe
// order, so a row whose transaction commits late is not skipped.
func ExampleLiveTable() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://…")
	// Once: ALTER TABLE events ADD COLUMN xact xid8 NOT NULL DEFAULT pg_current_xact_id();
	//       CREATE INDEX ON events (xact, id);
	type event struct {
		ID      int64
		Payload []byte
	}
	r, _ := checkpoint.NewRunner(checkpoint.Job[event]{
		Name: "index-events",
		Read: checkpoint.LiveTable[event]{Table: "events", Columns: "id, payload",
			Dest: func(e *event) []any { return []any{&e.ID, &e.Payload} }}.Read,
		Process: func(ctx context.Context, tx pgx.Tx, evs []event) error {
			for _, e := range evs {
				if _, err := tx.Exec(ctx, `INSERT INTO search_index (event_id, doc) VALUES ($1, $2)`, e.ID, e.Payload); err != nil {
					return err
				}
			}
			return nil
		},
	})
	_, _ = r.Run(ctx, pool)
}

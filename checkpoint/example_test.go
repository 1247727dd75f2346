package checkpoint_test

import (
	"context"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/checkpoint"
)

// A job over a table with a bigint key: the cursor is the last id.
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://…")
	_ = checkpoint.Migrate(ctx, pool)
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

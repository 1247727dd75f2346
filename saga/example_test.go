package saga_test

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/saga"
)

// A two-step saga whose second step is asynchronous: it enqueues a command
// in the step's transaction and waits for the reply, which an idem handler
// records with saga.Complete in its own transaction.
func Example() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, "postgres://…")
	// idem.Migrate(ctx, pool) (or `idem migrate`) has created the saga tables.
	orch, _ := saga.New(saga.Config{DB: pool}, saga.Definition{
		Type:    "transfer",
		Timeout: time.Hour,
		Steps: []saga.Step{{
			Name: "debit",
			Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
				_, err := c.Tx.Exec(ctx, `UPDATE accounts SET balance = balance - 10 WHERE id = 'a'`)
				return nil, err
			},
			Compensate: func(ctx context.Context, c saga.Call) error {
				_, err := c.Tx.Exec(ctx, `UPDATE accounts SET balance = balance + 10 WHERE id = 'a'`)
				return err
			},
		}, {
			Name: "credit",
			Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
				// e.g. outbox.Enqueue(ctx, c.Tx, …) with c.Key as the idempotency key
				_, err := c.Tx.Exec(ctx, `INSERT INTO commands (key, body) VALUES ($1, $2)`, c.Key, c.Input)
				if err != nil {
					return nil, err
				}
				return nil, saga.ErrPending
			},
		}},
	})
	_, _ = orch.Start(ctx, pool, "transfer", "transfer-42", []byte(`{"to":"b"}`))
	go func() { _ = orch.Run(ctx) }()

	// In the idem handler consuming the bank's reply (tx: the handler's):
	reply := func(ctx context.Context, tx pgx.Tx) error {
		return saga.Complete(ctx, tx, "transfer-42", "credit", []byte(`{"ok":true}`))
	}
	_ = reply
}

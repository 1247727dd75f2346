package payments

import (
	"context"
	"fmt"

	"github.com/idemhq/idem"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schema is the service's own tables. Every statement is idempotent, so
// migrate runs at every start.
const schema = `
CREATE TABLE IF NOT EXISTS orders (
	id      text PRIMARY KEY,
	status  text NOT NULL DEFAULT 'pending',
	paid_at timestamptz
);
CREATE TABLE IF NOT EXISTS payments (
	id              bigserial PRIMARY KEY,
	idempotency_key text NOT NULL UNIQUE,
	order_id        text NOT NULL,
	amount          numeric NOT NULL,
	currency        text NOT NULL,
	status          text NOT NULL,
	created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS payments_order_id_idx ON payments (order_id);
`

// schemaLock is the advisory lock that serialises concurrent migrations of
// the tables above (CREATE TABLE IF NOT EXISTS alone can race in PostgreSQL).
const schemaLock = 0x1de3_0001

// migrate creates every table idem keeps (idem.Migrate: the inbox
// idem_processed, the outbox idem_outbox, …) and the service's tables.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := idem.Migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate idem's tables: %w", err)
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(schemaLock)); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, schema)
		return err
	})
	if err != nil {
		return fmt.Errorf("migrate payments schema: %w", err)
	}
	return nil
}

// openDB connects to url and checks the connection.
func openDB(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, usagef("DATABASE_URL: %v", err)
	}
	// One connection per in-flight message (one per claimed partition), plus
	// room for the demo's queries.
	if cfg.MaxConns < 16 {
		cfg.MaxConns = 16
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to PostgreSQL at %s: %w", cfg.ConnConfig.Host, err)
	}
	return pool, nil
}

package idemtest

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/tables"
)

// Handle runs h once for m as consumer.Run does once the inbox has taken
// m's key, for a handler's unit tests, without Kafka: in a transaction of
// p.Pool that commits when h returns nil and rolls back otherwise, whose
// ctx carries the transaction (dedupe.Tx) and what package step needs (its
// rows recorded in p.Pool's idem_steps for group, m.IdempotencyKey naming
// the message). No inbox row is written: calling it twice for one message
// runs h twice, as a redelivery after the inbox forgot the key would. It
// returns h's error as it is, for the test to classify. Only p.Pool is
// used: Postgres{Pool: pool} of a pool of your own (with idem's tables,
// idem.Migrate) works too.
func (p *Postgres) Handle(ctx context.Context, group string, h handler.Handler, m *handler.Message) error {
	return pgx.BeginFunc(ctx, p.Pool, func(tx pgx.Tx) error {
		sc := &tables.StepScope{DB: p.Pool, Group: group, Key: m.IdempotencyKey}
		return h.Handle(tables.WithStepScope(dedupe.WithTx(ctx, tx), sc), m)
	})
}

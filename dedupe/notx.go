package dedupe

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/handler"
)

// errNoTx is what every method of the transaction Tx returns when ctx
// carries none: the store that runs the handler has no database
// transaction (Memory, PostgresLease), or ctx is not the one the store
// passed. It is marked handler.Permanent, since retrying cannot give the
// message a transaction: the message is dead-lettered at once, with an
// error that names the store to configure. Code that serves both kinds of
// store asks HasTx first.
var errNoTx = handler.Permanent(errors.New("dedupe: no inbox transaction in ctx: the consumer's Dedupe store runs handlers without a database transaction " +
	"(dedupe.NewMemory, dedupe.NewPostgresLease); configure dedupe.NewPostgres " +
	"(in tests, idemtest.WithPostgres) to write through dedupe.Tx(ctx)"))

// noTx is the pgx.Tx that Tx returns when ctx carries no transaction: every
// method fails with errNoTx, so a handler written for the transactional
// inbox gets an error it can return, not a nil-pointer panic.
type noTx struct{}

var _ pgx.Tx = noTx{}

func (noTx) Begin(context.Context) (pgx.Tx, error) { return nil, errNoTx }
func (noTx) Commit(context.Context) error          { return errNoTx }
func (noTx) Rollback(context.Context) error        { return errNoTx }
func (noTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errNoTx
}
func (noTx) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	return pgx.FailedBatchResults(b, errNoTx)
}
func (noTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }
func (noTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errNoTx
}
func (noTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNoTx
}
func (noTx) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errNoTx }
func (noTx) QueryRow(context.Context, string, ...any) pgx.Row        { return noRow{} }
func (noTx) Conn() *pgx.Conn                                         { return nil }

type noRow struct{}

func (noRow) Scan(...any) error { return errNoTx }

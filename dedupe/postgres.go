package dedupe

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/handler"
)

// Postgres is the transactional inbox: a Store that runs the handler inside
// the same PostgreSQL transaction that records its idempotency key.
//
// Process does, for each message:
//
//	BEGIN
//	INSERT INTO idem_processed (consumer_group, idempotency_key, …) ON CONFLICT DO NOTHING
//	  0 rows → ROLLBACK, Duplicate (fn not called)
//	fn(ctx with the tx, see Tx)   — business writes and outbox rows go through the tx
//	  nil   → COMMIT: inbox row and effects become durable together → Processed
//	  error → ROLLBACK: nothing recorded, fn's error returned unchanged
//
// Two members processing the same key at once: the second's INSERT waits on
// the primary key until the first's transaction ends; if the first committed,
// the second sees the row and returns Duplicate; if it rolled back, the second
// proceeds. Exactly one set of effects is committed.
//
// Only effects written through Tx(ctx) are covered; effects outside
// PostgreSQL (HTTP calls, emails) may repeat — use PostgresLease or make them
// idempotent themselves. Each in-flight message holds one pooled connection
// for the duration of fn.
//
// A Postgres is safe for concurrent use when its DB is (a *pgxpool.Pool).
type Postgres struct {
	db    DB
	table table
	err   error // configuration error, reported by Migrate and Process
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns the transactional inbox store over db (normally a
// *pgxpool.Pool). Call Migrate (or idem.Migrate, which creates every
// idem table) once at start-up to create the table. A bad option (such as an empty table name) is reported
// by Migrate and by every Process call, never by a panic.
func NewPostgres(db DB, opts ...PostgresOption) *Postgres {
	c := newPGConfig(opts)
	t, err := parseTable(c.table)
	return &Postgres{db: db, table: t, err: err}
}

// Migrate creates or upgrades the store's table through the idem schema
// migrator (component "dedupe:<table>"). It is idempotent and safe to call
// concurrently from several processes. It creates the inbox table only:
// idem.Migrate creates it and every other table idem needs.
func (p *Postgres) Migrate(ctx context.Context) error {
	if p.err != nil {
		return p.err
	}
	return p.table.migrate(ctx, p.db)
}

// DB returns the database the store was built on, so idem can read its other
// tables (ordering mode's parked messages) through the same pool.
func (p *Postgres) DB() DB { return p.db }

// Process implements Store; see the Postgres type for the transaction it
// runs. The context given to fn carries the transaction (Tx(ctx)).
//
// Once fn has returned nil, COMMIT is attempted even if ctx has been
// cancelled meanwhile (with a 15 s limit), so finished work is not thrown
// away; ROLLBACK likewise runs on a context that is not cancelled.
//
// If COMMIT fails because of fn, the error is fn's fault, not an outage, so
// it is not a *StoreError: it wraps pgx.ErrTxCommitRollback when a statement
// inside the transaction failed and fn swallowed the error (PostgreSQL then
// turned COMMIT into ROLLBACK, and nothing was recorded), and
// pgx.ErrTxClosed when fn itself committed or rolled back the store's
// transaction (the key is recorded only if fn committed; a retry is safe
// either way). Any other COMMIT failure is a *StoreError with Op "commit":
// the outcome is unknown, and redelivery is safe because a committed inbox
// row turns it into a Duplicate.
func (p *Postgres) Process(ctx context.Context, rec Record, fn func(ctx context.Context) error) (out Outcome, err error) {
	if p.err != nil {
		return 0, &StoreError{Op: "config", Err: p.err}
	}
	if err := checkRecord(rec); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, &StoreError{Op: "begin", Err: err}
	}
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return 0, &StoreError{Op: "begin", Err: err}
	}
	done := false
	defer func() {
		if !done { // error paths and a panic in fn
			rollback(ctx, tx)
		}
	}()

	tag, err := tx.Exec(ctx, `INSERT INTO `+p.table.quoted+
		` (consumer_group, idempotency_key, topic, "partition", "offset") VALUES ($1, $2, $3, $4, $5)`+
		` ON CONFLICT (consumer_group, idempotency_key) DO NOTHING`,
		rec.Group, rec.Key, rec.Topic, rec.Partition, rec.Offset)
	if err != nil {
		return 0, &StoreError{Op: "insert", Err: err}
	}
	if tag.RowsAffected() == 0 {
		return Duplicate, nil // deferred rollback
	}

	if err := fn(WithTx(ctx, tx)); err != nil {
		if tx.Conn().IsClosed() && !handler.IsPermanent(err) && !handler.IsDecode(err) {
			// The handler failed because the database went away under it:
			// an outage, not the message's fault.
			return 0, &StoreError{Op: "handler", Err: err}
		}
		return 0, err // deferred rollback
	}

	done = true
	if err := commit(ctx, tx, rec.Group, rec.Key); err != nil {
		return 0, err
	}
	return Processed, nil
}

// commit commits tx once fn has returned nil, even if ctx has been cancelled
// meanwhile (within finishTimeout), and sorts its failure as Process
// documents. what names the record(s) in the error.
func commit(ctx context.Context, tx pgx.Tx, group, what string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	switch err := tx.Commit(cctx); {
	case err == nil:
		return nil
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return fmt.Errorf("%w: a statement inside it failed and the handler ignored the error, so PostgreSQL rolled it back (group %q, key %q): %w",
			errTxAborted, group, what, err)
	case errors.Is(err, pgx.ErrTxClosed):
		return fmt.Errorf("%w: the handler committed or rolled back the store's transaction itself (group %q, key %q): %w",
			errTxAborted, group, what, err)
	default:
		return &StoreError{Op: "commit", Err: err}
	}
}

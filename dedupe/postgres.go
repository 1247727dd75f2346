package dedupe

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/mutate"
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
// On a partitioned inbox (WithPartitions) no unique index spans the
// partitions, so the INSERT is preceded by the key's transaction-level
// advisory lock, and inserts the row only if no partition has the key
// (SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SELECT
// pg_advisory_xact_lock(…); INSERT … WHERE NOT EXISTS (…), in one round
// trip). The second member then waits on the lock instead of the index,
// with the same outcome, whichever partitions the two rows would go to.
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
	// locked: record keys on the key-lock path (the table is partitioned,
	// or WithPartitions was given) rather than with ON CONFLICT.
	locked atomic.Bool
	// at, when set (tests only), is the processed_at of the rows the store
	// inserts, instead of the transaction's now().
	at func() time.Time
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns the transactional inbox store over db (normally a
// *pgxpool.Pool). Call Migrate (or idem.Migrate, which creates every
// idem table) once at start-up to create the table. A bad option (such as an empty table name) is reported
// by Migrate and by every Process call, never by a panic.
func NewPostgres(db DB, opts ...PostgresOption) *Postgres {
	t, err := parseConfig(newPGConfig(opts))
	p := &Postgres{db: db, table: t, err: err}
	p.locked.Store(t.every > 0)
	return p
}

// Migrate creates or upgrades the store's table through the idem schema
// migrator (component "dedupe:<table>"). It is idempotent and safe to call
// concurrently from several processes. It creates the inbox table only:
// idem.Migrate creates it and every other table idem needs. With
// WithPartitions it then converts a plain table to the partitioned layout
// (see WithPartitions) and makes the partitions ahead.
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
	rec, err = stored(rec)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, &StoreError{Op: "begin", Err: err}
	}
	var tx pgx.Tx
	for retried := false; ; retried = true {
		if tx, err = p.db.Begin(ctx); err != nil {
			return 0, &StoreError{Op: "begin", Err: err}
		}
		fresh, err := p.insert(ctx, tx, rec)
		if err == nil && !fresh && !mutate.On(mutate.Inbox) {
			rollback(ctx, tx)
			return Duplicate, nil
		}
		if err == nil {
			break
		}
		rollback(ctx, tx)
		if retried || !p.heal(ctx, err) {
			return 0, &StoreError{Op: "insert", Err: err}
		}
	}
	done := false
	defer func() {
		if !done { // error paths and a panic in fn
			rollback(ctx, tx)
		}
	}()

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

// insert records rec's key in tx, and reports whether it is new: with ON
// CONFLICT on the plain table, or on the key-lock path (see Postgres).
func (p *Postgres) insert(ctx context.Context, tx pgx.Tx, rec Record) (bool, error) {
	if !p.locked.Load() {
		tag, err := tx.Exec(ctx, `INSERT INTO `+p.table.quoted+
			` (consumer_group, idempotency_key, topic, "partition", "offset") VALUES ($1, $2, $3, $4, $5)`+
			` ON CONFLICT (consumer_group, idempotency_key) DO NOTHING`,
			rec.Group, rec.Key, rec.Topic, rec.Partition, rec.Offset)
		return tag.RowsAffected() == 1, err
	}
	b := &pgx.Batch{}
	queueKeyLocks(b, keyLock(rec.Group, rec.Key))
	var fresh bool
	b.Queue(`INSERT INTO `+p.table.quoted+
		` (consumer_group, idempotency_key, topic, "partition", "offset", processed_at)`+
		` SELECT $1, $2, $3, $4, $5, coalesce($6, now())`+
		` WHERE NOT EXISTS (SELECT 1 FROM `+p.table.quoted+` WHERE consumer_group = $1 AND idempotency_key = $2)`+
		` ON CONFLICT DO NOTHING`,
		rec.Group, rec.Key, rec.Topic, rec.Partition, rec.Offset, testTime(p.at)).Exec(func(tag pgconn.CommandTag) error {
		fresh = tag.RowsAffected() == 1
		return nil
	})
	return fresh, tx.SendBatch(ctx, b).Close()
}

// heal reports whether an INSERT that failed with err may be tried again at
// once, after what err calls for: the table turned out partitioned (the
// store takes the key-lock path from now on), or it has no partition for
// now yet (the store makes it). The caller has rolled back, and has not
// called fn.
func (p *Postgres) heal(ctx context.Context, err error) bool {
	return healInsert(ctx, p.db, p.table, &p.locked, err)
}

func healInsert(ctx context.Context, db DB, t table, locked *atomic.Bool, err error) bool {
	switch {
	case isNoArbiter(err) && !locked.Load():
		locked.Store(true)
		return true
	case isNoPartition(err):
		_, merr := t.ensurePartitions(ctx, db)
		return merr == nil
	}
	return false
}

// testTime is the processed_at the tests' clock gives (nil: now()).
func testTime(at func() time.Time) *time.Time {
	if at == nil {
		return nil
	}
	t := at()
	return &t
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

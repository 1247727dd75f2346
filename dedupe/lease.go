package dedupe

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PostgresLease is a Store for handlers whose side effects are outside
// PostgreSQL (an HTTP call, an email), where no transaction can make the
// effect and its record atomic. It uses the same table as Postgres, with a
// claim ("lease") instead of a transaction held across fn:
//
//  1. Claim, in its own short transaction: insert the key with
//     status 'in_progress', lease_until = now() + lease and an owner token
//     (this store's random id plus the message's topic/partition/offset, the
//     same for every attempt of the message). An existing 'in_progress' row
//     whose lease has expired (its owner crashed or hung), or that carries
//     this very token (an earlier attempt's claim whose reply was lost), is
//     taken over. A 'done' row means Duplicate; a live
//     claim by another member means a retriable *StoreError wrapping
//     ErrInProgress.
//  2. Run fn with no transaction (Tx(ctx) is nil), its ctx's deadline set to
//     the end of the lease, so that fn stops before another member may take
//     the key over.
//  3. fn returned nil: mark the row 'done' (only if this member still owns
//     it) → Processed. fn failed or panicked: delete the claim (only if owned)
//     so that a retry can claim it at once, and return fn's error unchanged or
//     re-panic. The bookkeeping of this step runs even if ctx was cancelled.
//
// What it guarantees: while a claim is live, no other member runs fn for the
// key; once a key is 'done', fn never runs for it again (until the Sweeper
// removes the row); a failed fn is not recorded, so it is retried.
//
// What it does not guarantee: exactly-once effects. If the process dies, or
// loses the database, after the effect happened but before the key is marked
// done, the claim expires and another delivery runs fn again. The same holds
// if fn overruns its lease while ignoring its ctx (the member that finishes
// late then gets a *StoreError saying its lease expired and was taken over). The external side must therefore itself be
// idempotent with the key: pass rec.Key to it, for example as an
// Idempotency-Key HTTP header. Choose lease longer than fn's worst-case run
// time; a crashed claim blocks its key (ErrInProgress) until the lease ends.
//
// Do not use Postgres and PostgresLease on the same table for the same
// consumer group: Postgres treats a live claim as a Duplicate.
//
// A PostgresLease is safe for concurrent use when its DB is.
type PostgresLease struct {
	db    DB
	table table
	lease time.Duration
	err   error
	// owner identifies this store instance in lease_owner tokens; a token is
	// owner + the message's coordinates, so every attempt of one message
	// carries the same token (see Process).
	owner string
	// inflight holds the tokens of the Process calls running now: two
	// concurrent calls for one message still exclude each other.
	inflight sync.Map
	// locked and at are as on Postgres: the key-lock path (partitioned
	// table), and the tests' clock.
	locked atomic.Bool
	at     func() time.Time
}

var _ Store = (*PostgresLease)(nil)

// NewPostgresLease returns a lease-mode Store over db (normally a
// *pgxpool.Pool) using the inbox table selected by opts (default
// "idem_processed"; call Migrate once to create it).
//
// lease is how long a claim stays valid, and therefore the deadline given to
// fn and the time a crashed member's key stays blocked.
// Default: 5 minutes (when lease is 0). A negative lease, like a bad option,
// is reported by Migrate and every Process call.
func NewPostgresLease(db DB, lease time.Duration, opts ...PostgresOption) *PostgresLease {
	t, err := parseConfig(newPGConfig(opts))
	if lease == 0 {
		lease = defaultLease
	}
	if err == nil && lease < time.Millisecond {
		err = fmt.Errorf("%w: lease is %v, want at least 1ms (0 selects the default %v)", ErrInvalidConfig, lease, defaultLease)
	}
	owner, terr := newToken()
	if err == nil {
		err = terr
	}
	p := &PostgresLease{db: db, table: t, lease: lease, err: err, owner: owner}
	p.locked.Store(t.every > 0)
	return p
}

// Migrate creates or upgrades the table (partitioned with WithPartitions),
// exactly as Postgres.Migrate does.
func (p *PostgresLease) Migrate(ctx context.Context) error {
	if p.err != nil {
		return p.err
	}
	return p.table.migrate(ctx, p.db)
}

// Process implements Store; see the PostgresLease type for the protocol.
// Errors: a live claim by another member is a *StoreError wrapping
// ErrInProgress; a claim lost to another member after fn succeeded is a
// *StoreError with Op "complete" saying the lease expired and was taken
// over (the effect may then happen twice); fn's own error is returned unchanged.
func (p *PostgresLease) Process(ctx context.Context, rec Record, fn func(ctx context.Context) error) (Outcome, error) {
	if p.err != nil {
		return 0, &StoreError{Op: "config", Err: p.err}
	}
	rec, err := stored(rec)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, &StoreError{Op: "claim", Err: err}
	}
	// One token per message across its attempts: a claim whose reply was
	// lost (the INSERT committed, the connection died) is this message's own,
	// and its next attempt takes it back at once instead of waiting out the
	// lease behind itself.
	token := p.owner + ":" + rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10)
	if _, busy := p.inflight.LoadOrStore(token, struct{}{}); busy {
		return 0, &StoreError{Op: "claim", Err: fmt.Errorf("%w (group %q, key %q, by this process)", ErrInProgress, rec.Group, rec.Key)}
	}
	defer p.inflight.Delete(token)
	start := time.Now() // before the claim, so fn's deadline is no later than the lease's end
	out, err := p.claim(ctx, rec, token)
	if err != nil || out == Duplicate {
		return out, err
	}

	fctx, cancel := context.WithDeadline(ctx, start.Add(p.lease))
	defer cancel()
	finished := false
	defer func() {
		if !finished { // fn panicked: release the claim, let the panic continue
			_ = p.release(ctx, rec, token)
		}
	}()
	ferr := fn(fctx)
	finished = true
	if ferr != nil {
		_ = p.release(ctx, rec, token) // if this fails the claim simply expires
		return 0, ferr
	}
	return p.complete(ctx, rec, token)
}

func (p *PostgresLease) claim(ctx context.Context, rec Record, token string) (out Outcome, err error) {
	for retried := false; ; retried = true {
		if p.locked.Load() {
			out, err = p.claimLocked(ctx, rec, token)
		} else {
			out, err = p.claimPlain(ctx, rec, token)
		}
		se, ok := errors.AsType[*StoreError](err)
		if retried || !ok || se.Op != "claim" || !healInsert(ctx, p.db, p.table, &p.locked, se.Err) {
			return out, err
		}
	}
}

// claimLocked is claim on the key-lock path (see Postgres): in one
// transaction, the key's advisory lock, then one statement that reads the
// key's row in whichever partition holds it and inserts a claim when there
// is none, or takes over an expired one or this message's own.
func (p *PostgresLease) claimLocked(ctx context.Context, rec Record, token string) (Outcome, error) {
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return 0, &StoreError{Op: "claim", Err: err}
	}
	defer rollback(ctx, tx)
	b := &pgx.Batch{}
	queueKeyLocks(b, keyLock(rec.Group, rec.Key))
	var claimed bool
	var status *string
	var until *time.Time
	b.Queue(`WITH cur AS (SELECT status, lease_until, lease_owner FROM `+p.table.quoted+`
		  WHERE consumer_group = $1 AND idempotency_key = $2),
		ins AS (INSERT INTO `+p.table.quoted+`
		    (consumer_group, idempotency_key, topic, "partition", "offset", status, lease_until, lease_owner, processed_at)
		  SELECT $1, $2, $3, $4, $5, 'in_progress', now() + $6::bigint * interval '1 microsecond', $7, coalesce($8, now())
		  WHERE NOT EXISTS (SELECT 1 FROM cur) RETURNING 1),
		upd AS (UPDATE `+p.table.quoted+` SET topic = $3, "partition" = $4, "offset" = $5,
		    processed_at = coalesce($8, now()), lease_until = now() + $6::bigint * interval '1 microsecond', lease_owner = $7
		  WHERE consumer_group = $1 AND idempotency_key = $2 AND status = 'in_progress' AND (lease_until < now() OR lease_owner = $7)
		  RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM ins) OR EXISTS (SELECT 1 FROM upd), (SELECT status FROM cur LIMIT 1), (SELECT lease_until FROM cur LIMIT 1)`,
		rec.Group, rec.Key, rec.Topic, rec.Partition, rec.Offset, p.lease.Microseconds(), token, testTime(p.at)).
		QueryRow(func(r pgx.Row) error { return r.Scan(&claimed, &status, &until) })
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, &StoreError{Op: "claim", Err: err}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, &StoreError{Op: "claim", Err: err}
	}
	switch {
	case claimed:
		return Processed, nil
	case status != nil && *status == "done":
		return Duplicate, nil
	}
	var u time.Time
	if until != nil {
		u = *until
	}
	return 0, &StoreError{Op: "claim", Err: fmt.Errorf("%w (group %q, key %q, lease until %s)",
		ErrInProgress, rec.Group, rec.Key, u.Format(time.RFC3339Nano))}
}

// lockedExec runs sql (args) on the key-lock path: in a transaction of its
// own, after the key's advisory lock, so that it never races a claim that
// moves the row to another partition.
func (p *PostgresLease) lockedExec(ctx context.Context, rec Record, sql string, args ...any) (pgconn.CommandTag, error) {
	if !p.locked.Load() {
		return p.db.Exec(ctx, sql, args...)
	}
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer rollback(ctx, tx)
	b := &pgx.Batch{}
	queueKeyLocks(b, keyLock(rec.Group, rec.Key))
	var tag pgconn.CommandTag
	b.Queue(sql, args...).Exec(func(t pgconn.CommandTag) error {
		tag = t
		return nil
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return tag, err
	}
	return tag, tx.Commit(ctx)
}

func (p *PostgresLease) claimPlain(ctx context.Context, rec Record, token string) (Outcome, error) {
	claimSQL := `INSERT INTO ` + p.table.quoted + ` AS p` +
		` (consumer_group, idempotency_key, topic, "partition", "offset", status, lease_until, lease_owner)` +
		` VALUES ($1, $2, $3, $4, $5, 'in_progress', now() + $6::bigint * interval '1 microsecond', $7)` +
		` ON CONFLICT (consumer_group, idempotency_key) DO UPDATE SET` +
		` topic = EXCLUDED.topic, "partition" = EXCLUDED."partition", "offset" = EXCLUDED."offset",` +
		` processed_at = now(), lease_until = EXCLUDED.lease_until, lease_owner = EXCLUDED.lease_owner` +
		` WHERE p.status = 'in_progress' AND (p.lease_until < now() OR p.lease_owner = EXCLUDED.lease_owner)` +
		` RETURNING true`
	stateSQL := `SELECT status, lease_until FROM ` + p.table.quoted +
		` WHERE consumer_group = $1 AND idempotency_key = $2`
	// A claim released between our two statements makes the row vanish; try
	// again a few times before calling it contention.
	for range 3 {
		var claimed bool
		err := p.db.QueryRow(ctx, claimSQL, rec.Group, rec.Key, rec.Topic, rec.Partition, rec.Offset,
			p.lease.Microseconds(), token).Scan(&claimed)
		if err == nil {
			return Processed, nil // claimed; the caller runs fn
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return 0, &StoreError{Op: "claim", Err: err}
		}
		var status string
		var until *time.Time
		err = p.db.QueryRow(ctx, stateSQL, rec.Group, rec.Key).Scan(&status, &until)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			continue
		case err != nil:
			return 0, &StoreError{Op: "claim", Err: err}
		case status == "done":
			return Duplicate, nil
		default:
			var u time.Time
			if until != nil {
				u = *until
			}
			return 0, &StoreError{Op: "claim", Err: fmt.Errorf("%w (group %q, key %q, lease until %s)",
				ErrInProgress, rec.Group, rec.Key, u.Format(time.RFC3339Nano))}
		}
	}
	return 0, &StoreError{Op: "claim", Err: fmt.Errorf("%w (group %q, key %q, claim churning)", ErrInProgress, rec.Group, rec.Key)}
}

func (p *PostgresLease) complete(ctx context.Context, rec Record, token string) (Outcome, error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
	defer cancel()
	tag, err := p.lockedExec(cctx, rec, `UPDATE `+p.table.quoted+
		` SET status = 'done', processed_at = coalesce($4, now()), lease_until = NULL, lease_owner = NULL`+
		` WHERE consumer_group = $1 AND idempotency_key = $2 AND lease_owner = $3 AND status = 'in_progress'`,
		rec.Group, rec.Key, token, testTime(p.at))
	if err != nil {
		return 0, &StoreError{Op: "complete", Err: err}
	}
	if tag.RowsAffected() == 0 {
		return 0, &StoreError{Op: "complete", Err: fmt.Errorf("%w (group %q, key %q, lease %v)", errLeaseLost, rec.Group, rec.Key, p.lease)}
	}
	return Processed, nil
}

func (p *PostgresLease) release(ctx context.Context, rec Record, token string) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	_, err := p.lockedExec(rctx, rec, `DELETE FROM `+p.table.quoted+
		` WHERE consumer_group = $1 AND idempotency_key = $2 AND lease_owner = $3 AND status = 'in_progress'`,
		rec.Group, rec.Key, token)
	return err
}

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("random lease token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

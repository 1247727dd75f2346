// Package pglead is the leader election idem's background publishers share:
// a dedicated PostgreSQL connection on which a session advisory lock is
// taken, then held for as long as the connection lives. The leader does its
// work on that same connection, so a leader whose connection dies can write
// nothing more and loses the lock in the same instant; when its process
// dies, PostgreSQL ends the session and a standby takes over within one
// retry interval.
//
// schedule.Scheduler (one leader per consumer group) and outbox.Relay (one
// leader per table) use it: one election, one way to wait and back off.
package pglead

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Conn takes a connection out of pool for good (Hijack: it is never
// returned to the pool) and returns it with a function that closes it,
// which ends the session and so releases every lock it holds.
func Conn(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, func(), error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("acquire connection: %w", err)
	}
	conn := pc.Hijack()
	return conn, func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}, nil
}

// Lock tries pg_try_advisory_lock(key) on conn every retry until it holds
// the lock (true), ctx ends (false, nil) or a statement fails (an error:
// the connection is unusable). standby, when not nil, runs once, the first
// time the lock is found held by another session. Each statement is bounded
// by timeout.
func Lock(ctx context.Context, conn *pgx.Conn, key int64, retry, timeout time.Duration, standby func()) (bool, error) {
	for waited := false; ; waited = true {
		var got bool
		if err := QueryRow(ctx, conn, timeout, "SELECT pg_try_advisory_lock($1)", key).Scan(&got); err != nil {
			return false, fmt.Errorf("try advisory lock: %w", err)
		}
		if got {
			return true, nil
		}
		if !waited && standby != nil {
			standby()
		}
		if !Sleep(ctx, retry) {
			return false, nil
		}
	}
}

// QueryRow runs sql on conn with a timeout that is released once the row is
// scanned.
func QueryRow(ctx context.Context, conn *pgx.Conn, timeout time.Duration, sql string, args ...any) pgx.Row {
	qctx, cancel := context.WithTimeout(ctx, timeout)
	return cancelRow{conn.QueryRow(qctx, sql, args...), cancel}
}

type cancelRow struct {
	pgx.Row
	cancel context.CancelFunc
}

func (r cancelRow) Scan(dest ...any) error {
	defer r.cancel()
	return r.Row.Scan(dest...)
}

// Sleep waits d or until ctx is done; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Backoff is the wait after the n-th failure in a row (n >= 1) to start or
// to reconnect: a random duration in [c/2, c], c = min(ceiling,
// first·2^(n-1)).
func Backoff(n int, first, ceiling time.Duration) time.Duration {
	c := ceiling
	if n-1 < 30 && first<<(n-1) > 0 && first<<(n-1) < c {
		c = first << (n - 1)
	}
	return c/2 + rand.N(c-c/2+1)
}

// Wait blocks until a NOTIFY arrives on conn (LISTEN first), d passes, or
// ctx ends; only a failure of the connection is an error.
func Wait(ctx context.Context, conn *pgx.Conn, d time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, max(d, time.Millisecond))
	defer cancel()
	_, err := conn.WaitForNotification(wctx)
	if err != nil && wctx.Err() == nil {
		return fmt.Errorf("wait for notification: %w", err)
	}
	return nil
}

// Until converts secs, a number of seconds from now the database computed
// (nil: nothing pending), into a wait of at least a millisecond and at most
// ceiling.
func Until(secs *float64, ceiling time.Duration) time.Duration {
	if secs == nil {
		return ceiling
	}
	return min(ceiling, max(time.Millisecond, time.Duration(*secs*float64(time.Second))))
}

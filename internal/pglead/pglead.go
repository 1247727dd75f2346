// Package pglead is the leader election idem's background publishers share:
// a dedicated PostgreSQL connection on which a session advisory lock is
// taken, then held for as long as the connection lives. The leader does its
// work on that same connection, so a leader whose connection dies can write
// nothing more and loses the lock in the same instant; when its process
// dies, PostgreSQL ends the session and a standby takes over within one
// retry interval.
//
// schedule.Scheduler (one leader per consumer group) and outbox.Relay (one
// leader per table) run it through Election: one election, one way to
// start, stand by, lead, wait and back off.
package pglead

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Election is one background publisher's part in the election of the
// leader of one lock: start once, then sessions until ctx ends. Each
// session takes a dedicated connection (Conn), finds the table's oid,
// tries the lock every Retry (standing by meanwhile), LISTENs on the
// table's channel once it holds the lock, and runs Lead on that
// connection until it fails. A failed start or session is retried after
// Backoff(n, Retry, RetryMax), n counting the failures in a row (a session
// that got its connection starts the count over).
type Election struct {
	// Pool gives the session's connection, taken out of it for good.
	Pool *pgxpool.Pool
	// Name is what the logs call the publisher ("outbox relay").
	Name string
	// Table is the quoted table whose oid Key and Channel are made from.
	Table string
	// Key is the advisory lock key of the table whose oid is given.
	Key func(oid uint32) int64
	// Channel is the NOTIFY channel the leader LISTENs on ("": none).
	Channel func(oid uint32) string
	// Retry is how often a standby tries the lock, and the first backoff;
	// RetryMax caps the backoff; Timeout bounds each statement.
	Retry, RetryMax, Timeout time.Duration
	// Log receives the election's lines.
	Log *slog.Logger
	// Start runs before the first session, retried with backoff until it
	// returns nil (migrate the table, connect to Kafka), or an error
	// wrapping ErrGiveUp, which ends Run.
	Start func(ctx context.Context) error
	// Lead runs while this session holds the lock, on its connection,
	// until that fails (an error) or ctx ends (nil).
	Lead func(ctx context.Context, conn *pgx.Conn) error
	// Leader, when set, is set to 1 while this session holds the lock and
	// to 0 when it lets it go (a leader gauge).
	Leader interface{ Set(float64) }
	// Health, when set, is told nil once started and while connected, and
	// each start or session failure.
	Health func(error)
}

// ErrGiveUp, wrapped by Start's error, ends Run at once: retrying cannot
// help (a key file that does not match the table's keys). The publisher
// says why.
var ErrGiveUp = errors.New("pglead: cannot start")

// Run starts, then runs sessions until ctx ends. It reports whether Start
// succeeded (false: ctx ended first, or Start gave up).
func (e *Election) Run(ctx context.Context) bool {
	health := e.Health
	if health == nil {
		health = func(error) {}
	}
	for n := 1; ; n++ {
		err := e.Start(ctx)
		if err == nil {
			health(nil)
			if n > 1 {
				e.Log.Info("idem: "+e.Name+" started", "attempts", n)
			}
			break
		}
		if ctx.Err() != nil || errors.Is(err, ErrGiveUp) {
			return false
		}
		health(err)
		wait := Backoff(n, e.Retry, e.RetryMax)
		e.Log.Warn("idem: "+e.Name+" cannot start yet (database or brokers unreachable?); retrying", "err", err, "attempt", n, "in", wait)
		if !Sleep(ctx, wait) {
			return false
		}
	}
	for failures := 1; ctx.Err() == nil; failures++ {
		connected, err := e.session(ctx, health)
		if ctx.Err() != nil {
			break
		}
		if connected {
			failures = 1
		}
		health(err)
		wait := Backoff(failures, e.Retry, e.RetryMax)
		e.Log.Warn("idem: "+e.Name+" session ended (database connection lost or refused); reconnecting", "err", err, "in", wait)
		Sleep(ctx, wait)
	}
	return true
}

// session is one connection's try at leading: it reports whether it got as
// far as standing by, and why it ended (nil when ctx ended).
func (e *Election) session(ctx context.Context, health func(error)) (connected bool, err error) {
	conn, release, err := Conn(ctx, e.Pool)
	if err != nil {
		return false, err
	}
	defer release() // ends the session: releases the lock
	var oid uint32
	if err := QueryRow(ctx, conn, e.Timeout, "SELECT $1::regclass::oid", e.Table).Scan(&oid); err != nil {
		return false, fmt.Errorf("find table %s: %w", e.Table, err)
	}
	health(nil)
	got, err := Lock(ctx, conn, e.Key(oid), e.Retry, e.Timeout, func() {
		e.Log.Info("idem: "+e.Name+" standing by: another holds the lock", "table", e.Table)
	})
	if err != nil || !got {
		return true, err
	}
	if e.Leader != nil {
		e.Leader.Set(1)
		defer e.Leader.Set(0)
	}
	e.Log.Info("idem: "+e.Name+" is the leader", "table", e.Table)
	if e.Channel != nil {
		qctx, cancel := context.WithTimeout(ctx, e.Timeout)
		_, err := conn.Exec(qctx, "LISTEN "+pgx.Identifier{e.Channel(oid)}.Sanitize())
		cancel()
		if err != nil {
			return true, fmt.Errorf("listen: %w", err)
		}
	}
	return true, e.Lead(ctx, conn)
}

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

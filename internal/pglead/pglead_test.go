package pglead_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/pglead"
)

// TestOneHolderThenTakeover: of two sessions one holds the lock; the other
// stands by (told once) and takes the lock when the holder's connection
// closes.
func TestOneHolderThenTakeover(t *testing.T) {
	pool := idemtest.ConnectPostgres(t).Pool
	ctx := t.Context()
	key := int64(time.Now().UnixNano())
	a, closeA, err := pglead.Conn(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := pglead.Lock(ctx, a, key, 10*time.Millisecond, time.Second, nil); !got || err != nil {
		t.Fatalf("first Lock = %v, %v", got, err)
	}
	b, closeB, err := pglead.Conn(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeB)
	standby := make(chan struct{}, 2)
	done := make(chan bool, 1)
	go func() {
		got, _ := pglead.Lock(ctx, b, key, 10*time.Millisecond, time.Second, func() { standby <- struct{}{} })
		done <- got
	}()
	<-standby
	select {
	case <-done:
		t.Fatal("the second session took a lock the first holds")
	default:
	}
	closeA()
	if !<-done {
		t.Fatal("the standby did not take the lock")
	}
	if len(standby) != 0 {
		t.Fatal("standby ran more than once")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got, err := pglead.Lock(cctx, b, key+1, time.Millisecond, time.Second, nil); got || err == nil {
		t.Fatalf("Lock on a cancelled ctx = %v, %v; want a failed statement", got, err)
	}
}

func TestBackoffBounds(t *testing.T) {
	for n := 1; n < 80; n++ {
		c := min(time.Second<<min(n-1, 20), 30*time.Second)
		for range 50 {
			if d := pglead.Backoff(n, time.Second, 30*time.Second); d < c/2 || d > c {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", n, d, c/2, c)
			}
		}
	}
}

// TestWaitWakesOnNotify: Wait returns at a NOTIFY long before its timeout,
// and nil at its timeout.
func TestWaitWakesOnNotify(t *testing.T) {
	db := idemtest.ConnectPostgres(t)
	pool, ctx := db.Pool, t.Context()
	conn, release, err := pglead.Conn(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	ch := db.Schema // unique to the test
	if _, err := conn.Exec(ctx, "LISTEN "+ch); err != nil {
		t.Fatal(err)
	}
	if err := pglead.Wait(ctx, conn, 10*time.Millisecond); err != nil {
		t.Fatalf("Wait timing out: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- pglead.Wait(ctx, conn, time.Hour) }()
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, '')", ch); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait did not wake at the NOTIFY")
	}
}

func TestUntil(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tt := range []struct {
		secs *float64
		want time.Duration
	}{{nil, time.Minute}, {f(-5), time.Millisecond}, {f(0), time.Millisecond}, {f(1.5), 1500 * time.Millisecond}, {f(1e9), time.Minute}} {
		if got := pglead.Until(tt.secs, time.Minute); got != tt.want {
			t.Errorf("Until(%v) = %v, want %v", tt.secs, got, tt.want)
		}
	}
}

// gauge is a leader gauge a test can read.
type gauge struct{ v atomic.Int64 }

func (g *gauge) Set(v float64) { g.v.Store(int64(v)) }

// TestElectionOneLeaderThenFailover: two elections on one table; exactly
// one leads while the other stands by; when the leader stops, the standby
// leads within a few retries; when the new leader's session is killed, a
// session (the standby's reconnect or the other's) leads again.
func TestElectionOneLeaderThenFailover(t *testing.T) {
	db := idemtest.ConnectPostgres(t)
	pool, ctx := db.Pool, t.Context()
	if _, err := pool.Exec(ctx, "CREATE TABLE elected (x int)"); err != nil {
		t.Fatal(err)
	}
	key := int64(time.Now().UnixNano())
	type member struct {
		leader gauge
		leads  atomic.Int64 // Lead calls
		pid    atomic.Int32 // the leading session's backend
		stop   context.CancelFunc
		done   chan bool
	}
	run := func(m *member) {
		mctx, cancel := context.WithCancel(ctx)
		m.stop, m.done = cancel, make(chan bool, 1)
		e := &pglead.Election{
			Pool: pool, Name: "test", Table: "elected", Log: slog.New(slog.DiscardHandler),
			Key:     func(uint32) int64 { return key },
			Channel: func(oid uint32) string { return fmt.Sprintf("elected_%d", oid) },
			Retry:   20 * time.Millisecond, RetryMax: 100 * time.Millisecond, Timeout: 5 * time.Second,
			Start:  func(context.Context) error { return nil },
			Leader: &m.leader,
			Lead: func(ctx context.Context, conn *pgx.Conn) error {
				m.leads.Add(1)
				m.pid.Store(int32(conn.PgConn().PID()))
				for {
					if err := pglead.Wait(ctx, conn, time.Hour); err != nil || ctx.Err() != nil {
						return err
					}
				}
			},
		}
		go func() { m.done <- e.Run(mctx) }()
	}
	a, b := &member{}, &member{}
	run(a)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if a.leader.v.Load() != 1 {
			return errors.New("a does not lead yet")
		}
		return nil
	})
	run(b)
	// b stands by: its session holds a connection and tries the lock.
	idemtest.Eventually(t, 30*time.Second, func() error {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_try_advisory_lock%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return errors.New("b has not tried the lock yet")
		}
		return nil
	})
	if b.leader.v.Load() != 0 || b.leads.Load() != 0 {
		t.Fatal("both lead")
	}
	a.stop()
	if !<-a.done {
		t.Fatal("a reports it never started")
	}
	if a.leader.v.Load() != 0 {
		t.Fatal("a stopped but its gauge says it leads")
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		if b.leader.v.Load() != 1 {
			return errors.New("b has not taken over")
		}
		return nil
	})
	// Kill b's session: b reconnects and leads again (a is gone).
	run(a)
	killed := b.pid.Load()
	if _, err := pool.Exec(ctx, "SELECT pg_terminate_backend($1)", killed); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		if l := a.leader.v.Load() + b.leader.v.Load(); l != 1 {
			return fmt.Errorf("%d leaders", l)
		}
		if p := b.pid.Load(); b.leader.v.Load() == 1 && p == killed {
			return errors.New("b's gauge still shows the killed session")
		}
		return nil
	})
	b.stop()
	a.stop()
	<-b.done
	<-a.done
}

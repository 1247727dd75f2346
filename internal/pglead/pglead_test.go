package pglead_test

import (
	"context"
	"testing"
	"time"

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

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// TestService runs the service end to end on an in-process Kafka
// cluster and a PostgreSQL schema of its own: a duplicate event pays once,
// an order that is not pending is dead-lettered, and /readyz turns 200.
func TestService(t *testing.T) {
	pool, schema := testenv.PostgresSchema(t)
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()

	k := idemtest.NewKafka(t)
	k.CreateTopic(t, "orders", 2)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, k.Brokers[0], u.String(), addr) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	// run creates the orders table; seed it once it exists.
	idemtest.Eventually(t, 30*time.Second, func() error {
		_, err := pool.Exec(context.Background(), `INSERT INTO orders (id) VALUES ('o-1'), ('o-2') ON CONFLICT DO NOTHING`)
		return err
	})
	if _, err := pool.Exec(context.Background(), `UPDATE orders SET status = 'cancelled' WHERE id = 'o-2'`); err != nil {
		t.Fatal(err)
	}
	k.Produce(t, "orders",
		idemtest.Record{Value: []byte(`{"event_id":"e-1","order_id":"o-1","amount_cents":1999}`)},
		idemtest.Record{Value: []byte(`{"event_id":"e-1","order_id":"o-1","amount_cents":1999}`)}, // redelivered
		idemtest.Record{Partition: 1, Value: []byte(`{"event_id":"e-2","order_id":"o-2","amount_cents":500}`)},
	)
	dl := k.ReadDLQ(t, retrytopic.Policy{}.DLQ("orders", "orders-service"), 1)
	if dl[0].Failure.Kind != "permanent" || dl[0].Failure.Error != `order "o-2" is not pending` {
		t.Errorf("dead letter: %+v", dl[0].Failure)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		var status string
		var cents int64
		if err := pool.QueryRow(context.Background(), `SELECT status, coalesce(paid_cents, 0) FROM orders WHERE id = 'o-1'`).Scan(&status, &cents); err != nil {
			return err
		}
		if status != "paid" || cents != 1999 {
			return fmt.Errorf("o-1 is %s with %d cents", status, cents)
		}
		return nil
	})
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_processed WHERE idempotency_key = 'e-1'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("inbox rows for e-1: %d (err %v), want 1", n, err)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %s", resp.Status)
		}
		return nil
	})
}

// TestReadmeShowsThisHandler: README's "A handler" shows markPaid exactly as
// this service runs it, so the handler the README explains is the one
// TestService runs end to end (internal/testing/doctest compiles the README's
// snippet on its own).
func TestReadmeShowsThisHandler(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	fn := regexp.MustCompile(`(?ms)^// markPaid .*?^}\n`)
	want := fn.Find(src)
	if want == nil {
		t.Fatal("main.go has no markPaid with its doc comment")
	}
	got := fn.Find(readme)
	if got == nil {
		t.Fatal("README.md shows no markPaid: its \"A handler\" section should")
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("README.md's markPaid differs from main.go's; copy main.go's into README's \"A handler\":\n%s", want)
	}
}

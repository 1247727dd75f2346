package outbox_test

import (
	"context"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/outbox"
)

// A write and its event commit together; a relay publishes the event.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://idem:idem@127.0.0.1:5432/idem")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// idem.Migrate(ctx, pool), at start, created idem_outbox with every idem table.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, "order-1"); err != nil {
			return err
		}
		return outbox.Enqueue(ctx, tx, outbox.Message{
			Topic: "orders.events",
			Key:   []byte("order-1"),
			Value: []byte(`{"type":"order.paid","order_id":"order-1"}`),
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	// Usually in its own goroutine next to consumer.Run, or in a process of its own.
	relay := &outbox.Relay{Pool: pool, Brokers: []string{"127.0.0.1:9092"}}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A reminder published a day after the order is placed, by the database
// clock. Later events of the same key wait behind it, so it uses a key of
// its own.
func ExampleMessage_notBefore() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://idem:idem@127.0.0.1:5432/idem")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return outbox.Enqueue(ctx, tx, outbox.Message{
			Topic:     "orders.reminders",
			Key:       []byte("order-1/reminder"),
			Value:     []byte(`{"type":"order.unpaid_reminder","order_id":"order-1"}`),
			NotBefore: time.Now().Add(24 * time.Hour),
		})
	})
	if err != nil {
		log.Fatal(err)
	}
}

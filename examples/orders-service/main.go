// Command orders-service is the small, complete service whose handler
// README's "A handler" shows. It consumes the "orders" topic and marks each order
// paid in PostgreSQL exactly once, retries failures through two retry
// topics, dead-letters what cannot succeed, sweeps its inbox, and serves
// /metrics, /healthz and /readyz on :9464.
//
//	KAFKA_BROKERS=127.0.0.1:9092 DATABASE_URL=postgres://... go run ./examples/orders-service
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/retrytopic"
)

// OrderPaid is the value of a record on the "orders" topic.
type OrderPaid struct {
	EventID string `json:"event_id"` // unique per event: the idempotency key
	OrderID string `json:"order_id"`
	Cents   int64  `json:"amount_cents"`
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv("KAFKA_BROKERS"), os.Getenv("DATABASE_URL"), ":9464"); err != nil {
		slog.Error("orders-service stopped", "err", err)
		os.Exit(1)
	}
}

// run is the service until ctx is cancelled: brokers is a comma-separated
// list, metricsAddr where /metrics, /healthz and /readyz are served.
func run(ctx context.Context, brokers, databaseURL, metricsAddr string) error {
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// Every table idem needs (inbox, ordering, ...): idempotent, safe at every start.
	if err := idem.Migrate(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id text PRIMARY KEY, status text NOT NULL DEFAULT 'pending', paid_cents bigint)`); err != nil {
		return err
	}

	base := sarama.NewConfig()
	base.ClientID = "orders-service"
	// base.Version = sarama.V3_7_0_0 // for a Kafka 3.x cluster (the default is 4.0)
	// base.Net.TLS / base.Net.SASL for a secured cluster: docs/secured-clusters.md.

	reg := prometheus.NewRegistry()
	ready := consumer.NewReadiness()
	cfg := consumer.Config{
		Brokers: strings.Split(brokers, ","),
		Group:   "orders-service",
		Topics:  []string{"orders"},
		// Producers put the event id in the body; a header wins when present.
		// A record with neither is dead-lettered (kind missing-key) unhandled.
		KeyFunc: consumer.FirstOf(consumer.HeaderKey("idempotency-key"), consumer.JSONField("event_id")),
		Dedupe:  dedupe.NewPostgres(pool), // the handler's writes commit with the inbox row
		// Run deletes inbox rows older than this itself (14 days is the default).
		Retention: consumer.RetentionConfig{Keep: 14 * 24 * time.Hour},
		// 4 attempts at the source (3 in-process retries), then 4 in each tier, then the DLQ.
		Retry: consumer.RetryConfig{
			Attempts: 4,
			Tiers:    retrytopic.Policy{Delays: []time.Duration{30 * time.Second, 10 * time.Minute}},
		},
		Sarama:     base,
		Registerer: reg,
		Readiness:  ready, // /readyz: group joined and PostgreSQL answering
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the metrics server when Run returns
	wg.Go(func() {
		if err := metrics.Serve(ctx, metricsAddr, reg, ready.Check); err != nil {
			slog.Error("metrics server", "err", err)
		}
	})
	return consumer.Run(ctx, cfg, handler.Func(markPaid))
}

// markPaid marks one order paid in the message's transaction: with the inbox
// row, or not at all.
func markPaid(ctx context.Context, m *handler.Message) error {
	var e OrderPaid
	if err := json.Unmarshal(m.Value, &e); err != nil {
		return handler.Decode(err) // poison: dead-lettered at once, bytes kept
	}
	tag, err := dedupe.Tx(ctx).Exec(ctx,
		`UPDATE orders SET status = 'paid', paid_cents = $2 WHERE id = $1 AND status = 'pending'`, e.OrderID, e.Cents)
	if err != nil {
		return err // retried: in process, then the retry topics, then the DLQ
	}
	if tag.RowsAffected() == 0 {
		return handler.Permanent(fmt.Errorf("order %q is not pending", e.OrderID)) // to the DLQ for a human
	}
	return nil
}

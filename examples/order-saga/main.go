// Command order-saga is idem's saga example: an order event consumed from
// Kafka starts a saga, reserve stock → charge payment → schedule shipping;
// a declined payment releases the reservation, a shipping failure refunds
// the charge and releases the reservation. Payment is a direct call;
// shipping is a Kafka command sent through the outbox, answered by a
// shipping service (an idem consumer) whose reply resumes the saga.
//
// Usage:
//
//	order-saga [-n 60] [-timeout 2m] [-v]
//
// It reads KAFKA_BROKERS and DATABASE_URL (`make services` prints them),
// produces n orders (and a duplicate delivery of every tenth) to fresh
// topics, runs the consumers, the outbox relay and the saga orchestrator
// until every saga is final, prints the figures and exits non-zero unless
// they balance.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/saga"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "order-saga:", err)
		os.Exit(1)
	}
}

// options are the demo's flags.
type options struct {
	N       int
	Timeout time.Duration
	Verbose bool
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("order-saga", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.IntVar(&o.N, "n", 60, "orders to produce")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.BoolVar(&o.Verbose, "v", false, "idem's info logs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	brokers := strings.Split(os.Getenv("KAFKA_BROKERS"), ",")
	dbURL := os.Getenv("DATABASE_URL")
	if brokers[0] == "" || dbURL == "" {
		return errors.New("set KAFKA_BROKERS and DATABASE_URL (make services; set -a; . .state/services.env; set +a)")
	}
	s, err := demo(ctx, brokers, dbURL, o, stderr)
	if err != nil {
		return err
	}
	s.print(stdout)
	return s.check()
}

// summary is what the demo reads back from PostgreSQL.
type summary struct {
	Run                       string
	Orders, Duplicates        int
	WantDeclined, WantNoShip  int
	Completed, Compensated    int64
	Charges, Refunds, Shipped int64
	Replies                   int64 // schedule-shipping steps settled by a reply (Complete or Fail)
	Reserved, StockLeft       int64 // units still reserved; units left in stock
	StockStart                int64
	ShippedUnits              int64
	Took                      time.Duration
}

func (s summary) print(w io.Writer) {
	fmt.Fprintf(w, "idem order saga — run %s\n", s.Run)
	fmt.Fprintf(w, "  orders:        %d (+%d duplicate deliveries) in %s\n", s.Orders, s.Duplicates, s.Took.Round(time.Millisecond))
	fmt.Fprintf(w, "  completed:     %d sagas; shipped %d, charged %d\n", s.Completed, s.Shipped, s.Charges)
	fmt.Fprintf(w, "  shipping:      %d commands answered through Kafka (outbox → shipping service → reply → saga.Complete/Fail)\n", s.Replies)
	fmt.Fprintf(w, "  compensated:   %d sagas (%d declined payments: reservation released; %d without address: refunded and released); refunds %d\n",
		s.Compensated, s.WantDeclined, s.WantNoShip, s.Refunds)
	fmt.Fprintf(w, "  stock:         %d at start, %d shipped, %d left, %d still reserved\n", s.StockStart, s.ShippedUnits, s.StockLeft, s.Reserved)
}

// check is nil when the figures balance: each order's saga ran once, every
// compensation undid exactly what its step did.
func (s summary) check() error {
	var errs []error
	want := func(what string, got, want int64) {
		if got != want {
			errs = append(errs, fmt.Errorf("%s = %d, want %d", what, got, want))
		}
	}
	ok := int64(s.Orders - s.WantDeclined - s.WantNoShip)
	want("completed sagas", s.Completed, ok)
	want("compensated sagas", s.Compensated, int64(s.WantDeclined+s.WantNoShip))
	want("shipments", s.Shipped, ok)
	want("shipping replies", s.Replies, ok+int64(s.WantNoShip))
	want("charges", s.Charges, ok+int64(s.WantNoShip))
	want("refunds", s.Refunds, int64(s.WantNoShip))
	want("units still reserved", s.Reserved, s.ShippedUnits)
	want("stock left", s.StockLeft, s.StockStart-s.ShippedUnits)
	return errors.Join(errs...)
}

// orders builds the run's orders: every 5th is declined (over the card
// limit), every 7th (not declined) has no address.
func orders(run string, n int) (out []Order, declined, noShip int) {
	for i := 1; i <= n; i++ {
		o := Order{ID: fmt.Sprintf("%s-order-%04d", run, i), SKU: run + "-sku", Qty: 1 + i%3, Amount: 10_00 + i, Address: "1 Main St"}
		switch {
		case i%5 == 0:
			o.Amount = cardLimit + 1
			declined++
		case i%7 == 0:
			o.Address = ""
			noShip++
		}
		out = append(out, o)
	}
	return out, declined, noShip
}

func demo(ctx context.Context, brokers []string, dbURL string, o options, stderr io.Writer) (summary, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := summary{Run: fmt.Sprintf("saga-%d-%s", time.Now().Unix(), hex.EncodeToString(b[:]))}
	level := slog.LevelWarn
	if o.Verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return s, err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return s, fmt.Errorf("migrate: %w", err)
	}
	ords, declined, noShip := orders(s.Run, o.N)
	s.Orders, s.WantDeclined, s.WantNoShip = len(ords), declined, noShip
	s.StockStart = int64(2 * len(ords) * 3) // plenty for every order
	if _, err := pool.Exec(ctx, `INSERT INTO stock (sku, qty) VALUES ($1, $2)`, s.Run+"-sku", s.StockStart); err != nil {
		return s, err
	}

	reg := prometheus.NewRegistry()
	breakers, err := breaker.NewSet(breaker.Settings{})
	if err != nil {
		return s, err
	}
	t := topics{Orders: s.Run, Commands: s.Run + "-ship", Replies: s.Run + "-shipped"}
	scfg := sarama.NewConfig()
	scfg.Version = sarama.V4_0_0_0
	for _, topic := range []string{t.Orders, t.Commands, t.Replies} {
		if err := createTopic(brokers, scfg, topic); err != nil {
			return s, err
		}
		defer deleteTopic(brokers, scfg, topic, log)
	}
	orch, err := saga.New(saga.Config{DB: pool, Registerer: reg, Logger: log, PollInterval: 100 * time.Millisecond},
		orderSaga(paymentService{db: pool}, breakers, t))
	if err != nil {
		return s, err
	}
	start := time.Now()
	if s.Duplicates, err = produce(brokers, scfg, t.Orders, ords); err != nil {
		return s, err
	}

	// One consumer starts sagas, the orchestrator drives them, the relay
	// publishes the outbox, the shipping service handles commands, and a
	// last consumer feeds its replies back to the sagas.
	runCtx, stop := context.WithCancel(ctx)
	consume := func(group, topic string, h handler.Func) func() error {
		return func() error {
			return consumer.Run(runCtx, consumer.Config{
				Brokers: brokers, Group: group, Topics: []string{topic},
				Dedupe: dedupe.NewPostgres(pool), Sarama: scfg, Logger: log, Registerer: reg,
			}, h)
		}
	}
	relay := &outbox.Relay{Pool: pool, Brokers: brokers, Sarama: scfg, Logger: log, Registerer: reg}
	workers := []func() error{
		func() error { return orch.Run(runCtx) },
		func() error { return relay.Run(runCtx) },
		consume(s.Run, t.Orders, startSaga(orch)),
		consume(s.Run+"-shipping", t.Commands, handleShipCommand(t.Replies)),
		consume(s.Run+"-replies", t.Replies, handleReply),
	}
	done := make(chan error, len(workers))
	for _, w := range workers {
		go func() { done <- w() }()
	}
	waitErr := waitFinal(ctx, pool, s.Run, len(ords))
	stop()
	for range workers {
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			waitErr = errors.Join(waitErr, err)
		}
	}
	s.Took = time.Since(start)
	if waitErr != nil {
		return s, waitErr
	}
	return s, readFigures(ctx, pool, &s)
}

// waitFinal polls until the run's n sagas are all completed or compensated.
func waitFinal(ctx context.Context, pool *pgxpool.Pool, run string, n int) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var final int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_saga WHERE id LIKE $1 || '-order-%'
			AND state IN ('completed', 'compensated')`, run).Scan(&final); err != nil {
			return err
		}
		if final == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d sagas final: %w", final, n, ctx.Err())
		case <-t.C:
		}
	}
}

func readFigures(ctx context.Context, pool *pgxpool.Pool, s *summary) error {
	like := s.Run + "-order-%"
	return pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM idem_saga WHERE id LIKE $1 AND state = 'completed'),
		(SELECT count(*) FROM idem_saga WHERE id LIKE $1 AND state = 'compensated'),
		(SELECT count(*) FROM charges WHERE order_id LIKE $1),
		(SELECT count(*) FROM refunds WHERE key LIKE $1),
		(SELECT count(*) FROM shipments WHERE order_id LIKE $1),
		(SELECT coalesce(sum(qty), 0) FROM reservations WHERE order_id LIKE $1),
		(SELECT coalesce(sum(r.qty), 0) FROM reservations r JOIN shipments sh ON sh.order_id = r.order_id WHERE r.order_id LIKE $1),
		(SELECT qty FROM stock WHERE sku = $2),
		(SELECT count(*) FROM idem_saga_step WHERE saga_id LIKE $1 AND name = 'schedule-shipping'
			AND (state = 'done' AND result IS NOT NULL OR state = 'compensated' OR state = 'failed'))`, like, s.Run+"-sku").
		Scan(&s.Completed, &s.Compensated, &s.Charges, &s.Refunds, &s.Shipped, &s.Reserved, &s.ShippedUnits, &s.StockLeft, &s.Replies)
}

func createTopic(brokers []string, scfg *sarama.Config, topic string) error {
	admin, err := sarama.NewClusterAdmin(brokers, scfg)
	if err != nil {
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: -1}, false); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// deleteTopic removes the run's topic; the rows stay, scoped by the run id.
func deleteTopic(brokers []string, scfg *sarama.Config, topic string, log *slog.Logger) {
	admin, err := sarama.NewClusterAdmin(brokers, scfg)
	if err == nil {
		err = admin.DeleteTopic(topic)
		_ = admin.Close()
	}
	if err != nil {
		log.Warn("delete the run's topic", "topic", topic, "err", err)
	}
}

// produce sends every order, keyed and with its id as idempotency-key, and
// a second delivery of every tenth; it returns how many duplicates it sent.
func produce(brokers []string, scfg *sarama.Config, topic string, ords []Order) (int, error) {
	pcfg := *scfg
	pcfg.Producer.Return.Successes = true
	pcfg.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(brokers, &pcfg)
	if err != nil {
		return 0, fmt.Errorf("producer: %w", err)
	}
	defer p.Close()
	var msgs []*sarama.ProducerMessage
	dups := 0
	for i, o := range ords {
		v, _ := json.Marshal(o)
		m := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(o.ID), Value: sarama.ByteEncoder(v),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(o.ID)}}}
		msgs = append(msgs, m)
		if i%10 == 0 {
			dup := *m
			msgs = append(msgs, &dup)
			dups++
		}
	}
	if err := p.SendMessages(msgs); err != nil {
		return 0, fmt.Errorf("produce: %w", err)
	}
	return dups, nil
}

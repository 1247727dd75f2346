// Command typed-orders is idem with typed messages: two topics whose
// records are in a schema registry's wire format — orders in Avro,
// shipments and returns in Protobuf — handled by three routes of one
// consumer.Run (by topic, and by the record's type), each decoded for its
// handler, the idempotency key of an order read from its Avro value, and
// the card charged through a durable step with a derived idempotency key.
// See README.md.
//
//	make services
//	set -a; . .state/services.env; set +a
//	go run ./examples/typed-orders -n 30
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/examples/typed-orders/shippingpb"
	"github.com/idemhq/idem/serde"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "typed-orders:", err)
		os.Exit(1)
	}
}

type options struct {
	N       int
	Timeout time.Duration
	Verbose bool
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("typed-orders", flag.ContinueOnError)
	var o options
	fs.IntVar(&o.N, "n", 30, "orders to place")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "give up after this long")
	fs.BoolVar(&o.Verbose, "v", false, "log at INFO")
	if err := fs.Parse(args); err != nil {
		return err
	}
	env := func(name string) (string, error) {
		if v := os.Getenv(name); v != "" {
			return v, nil
		}
		return "", fmt.Errorf("%s is not set: run `make services` and export .state/services.env", name)
	}
	brokers, err := env("KAFKA_BROKERS")
	if err != nil {
		return err
	}
	db, err := env("DATABASE_URL")
	if err != nil {
		return err
	}
	registry, err := env("SCHEMA_REGISTRY_URL")
	if err != nil {
		return err
	}
	s, err := demo(ctx, strings.Split(brokers, ","), db, registry, o, stderr)
	s.print(stdout)
	if err != nil {
		return err
	}
	return s.check()
}

// summary is what a run did.
type summary struct {
	Run                        string
	Orders, Duplicates         int
	Recorded, DistinctCharges  int
	Requests, Charges, Retried int
	WantShipped, Shipped       int
	WantReturned, Returned     int
	Took                       time.Duration
}

func (s summary) print(w io.Writer) {
	fmt.Fprintf(w, "idem typed orders — run %s\n", s.Run)
	fmt.Fprintf(w, "  orders:     %d Avro records (+%d duplicate deliveries), key read from the value, in %s\n", s.Orders, s.Duplicates, s.Took.Round(time.Millisecond))
	fmt.Fprintf(w, "  recorded:   %d orders, %d distinct charges\n", s.Recorded, s.DistinctCharges)
	fmt.Fprintf(w, "  psp:        %d requests, %d charges (%d handlers failed after charging and were retried)\n", s.Requests, s.Charges, s.Retried)
	fmt.Fprintf(w, "  shipments:  %d of %d Protobuf Shipped records recorded (route \"shipped\")\n", s.Shipped, s.WantShipped)
	fmt.Fprintf(w, "  returns:    %d of %d Protobuf Returned records recorded (route \"returned\", same topic)\n", s.Returned, s.WantReturned)
}

// check says whether the figures balance: every order recorded and charged
// once, no retry charged again, every shipment recorded.
func (s summary) check() error {
	var errs []error
	if s.Recorded != s.Orders || s.DistinctCharges != s.Orders {
		errs = append(errs, fmt.Errorf("%d orders recorded with %d charges, want %d", s.Recorded, s.DistinctCharges, s.Orders))
	}
	if s.Charges != s.Orders || s.Requests != s.Orders {
		errs = append(errs, fmt.Errorf("the PSP got %d requests and charged %d times, want %d each: a step ran twice", s.Requests, s.Charges, s.Orders))
	}
	if s.Shipped != s.WantShipped {
		errs = append(errs, fmt.Errorf("%d shipments recorded, want %d", s.Shipped, s.WantShipped))
	}
	if s.Returned != s.WantReturned {
		errs = append(errs, fmt.Errorf("%d returns recorded, want %d", s.Returned, s.WantReturned))
	}
	return errors.Join(errs...)
}

func demo(ctx context.Context, brokers []string, dbURL, registryURL string, o options, stderr io.Writer) (summary, error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	var b [4]byte
	_, _ = rand.Read(b[:])
	s := summary{Run: fmt.Sprintf("typed-%d-%s", time.Now().Unix(), hex.EncodeToString(b[:]))}
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
	if err := idem.Migrate(ctx, pool); err != nil { // the inbox, idem_steps, …
		return s, err
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS typed_orders (order_id text PRIMARY KEY, customer text NOT NULL,
			cents bigint NOT NULL, currency text NOT NULL, charge_id text NOT NULL);
		CREATE TABLE IF NOT EXISTS typed_shipments (order_id text PRIMARY KEY, carrier text NOT NULL, tracking text NOT NULL);
		CREATE TABLE IF NOT EXISTS typed_returns (order_id text PRIMARY KEY, reason text NOT NULL)`); err != nil {
		return s, err
	}
	reg, err := serde.NewRegistry(serde.RegistryConfig{URL: registryURL})
	if err != nil {
		return s, err
	}
	ordersTopic, shipmentsTopic := s.Run+"-orders", s.Run+"-shipments"
	c, err := newCodecs(reg, ordersTopic, shipmentsTopic)
	if err != nil {
		return s, err
	}
	scfg := sarama.NewConfig()
	scfg.Version = sarama.V4_0_0_0
	defer deleteRunTopics(brokers, scfg, s.Run, log) // the sources, and the retry and dead-letter topics idem made
	for _, topic := range []string{ordersTopic, shipmentsTopic} {
		if err := createTopic(brokers, scfg, topic); err != nil {
			return s, err
		}
	}
	start := time.Now()
	if err := s.produce(ctx, brokers, scfg, c, o.N, ordersTopic, shipmentsTopic); err != nil {
		return s, err
	}

	psp := newPSP()
	var retried atomic.Int64
	flaky := func(o OrderPlaced) bool { return strings.HasSuffix(o.OrderID, "3") } // one order in ten
	cfg := consumer.Config{
		Brokers: brokers, Group: s.Run, Topics: []string{ordersTopic, shipmentsTopic},
		Routes: routes(c, psp, ordersTopic, shipmentsTopic, flaky, &retried),
		// The type of a record of the shipments topic is the Protobuf
		// message its index path names (typedorders.Shipped, …).
		TypeOf: reg.RecordName,
		// Shipments and returns carry an idempotency-key header (the
		// default KeyFunc); the "placed" route reads an order's from its
		// Avro value.
		Dedupe: dedupe.NewPostgres(pool),
		Sarama: scfg,
		Logger: log,
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- consumer.Run(runCtx, cfg, nil) }() // routes only: what none takes is dead-lettered
	waitErr := waitFinal(ctx, pool, s.Run, o.N, s.WantShipped, s.WantReturned)
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		waitErr = errors.Join(waitErr, err)
	}
	s.Took = time.Since(start)
	s.Requests, s.Charges = psp.Figures()
	s.Retried = int(retried.Load())
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM typed_orders WHERE order_id LIKE $1),
		(SELECT count(DISTINCT charge_id) FROM typed_orders WHERE order_id LIKE $1),
		(SELECT count(*) FROM typed_shipments WHERE order_id LIKE $1),
		(SELECT count(*) FROM typed_returns WHERE order_id LIKE $1)`, s.Run+"-%").
		Scan(&s.Recorded, &s.DistinctCharges, &s.Shipped, &s.Returned); err != nil {
		waitErr = errors.Join(waitErr, err)
	}
	return s, waitErr
}

// produce places n orders (every tenth delivered twice), ships every third
// and takes every fifth back, encoded with the codecs (which register their
// schemas).
func (s *summary) produce(ctx context.Context, brokers []string, scfg *sarama.Config, c codecs, n int, ordersTopic, shipmentsTopic string) error {
	pcfg := *scfg
	pcfg.Producer.Return.Successes = true
	pcfg.Producer.RequiredAcks = sarama.WaitForAll
	p, err := sarama.NewSyncProducer(brokers, &pcfg)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer p.Close()
	var msgs []*sarama.ProducerMessage
	for i := range n {
		o := OrderPlaced{OrderID: fmt.Sprintf("%s-%03d", s.Run, i), Customer: fmt.Sprintf("customer-%d", i%7), Cents: int64(1000 + 25*i), Currency: "EUR"}
		v, err := c.orders.Encode(ctx, o)
		if err != nil {
			return err
		}
		m := &sarama.ProducerMessage{Topic: ordersTopic, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(v)}
		msgs = append(msgs, m)
		s.Orders++
		if i%10 == 0 {
			dup := *m
			msgs = append(msgs, &dup)
			s.Duplicates++
		}
		if i%3 == 0 {
			sv, err := c.shipments.Encode(ctx, &shippingpb.Shipped{OrderId: o.OrderID, Carrier: "dhl", Tracking: fmt.Sprintf("JD%06d", i)})
			if err != nil {
				return err
			}
			msgs = append(msgs, &sarama.ProducerMessage{Topic: shipmentsTopic, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(sv),
				Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("ship-" + o.OrderID)}}})
			s.WantShipped++
		}
		if i%5 == 0 {
			rv, err := c.returns.Encode(ctx, &shippingpb.Returned{OrderId: o.OrderID, Reason: "damaged"})
			if err != nil {
				return err
			}
			msgs = append(msgs, &sarama.ProducerMessage{Topic: shipmentsTopic, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(rv),
				Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("return-" + o.OrderID)}}})
			s.WantReturned++
		}
	}
	if err := p.SendMessages(msgs); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	return nil
}

// waitFinal polls until the run's orders, shipments and returns are all
// recorded.
func waitFinal(ctx context.Context, pool *pgxpool.Pool, run string, orders, shipments, returns int) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		var o, sh, re int
		if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM typed_orders WHERE order_id LIKE $1),
			(SELECT count(*) FROM typed_shipments WHERE order_id LIKE $1),
			(SELECT count(*) FROM typed_returns WHERE order_id LIKE $1)`, run+"-%").Scan(&o, &sh, &re); err != nil {
			return err
		}
		if o == orders && sh == shipments && re == returns {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d orders, %d of %d shipments and %d of %d returns recorded: %w", o, orders, sh, shipments, re, returns, ctx.Err())
		case <-t.C:
		}
	}
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

// deleteRunTopics removes the run's topics: its sources and the retry and
// dead-letter topics idem made for them, all named after the run; the rows
// stay, scoped by the run id.
func deleteRunTopics(brokers []string, scfg *sarama.Config, run string, log *slog.Logger) {
	admin, err := sarama.NewClusterAdmin(brokers, scfg)
	if err != nil {
		log.Warn("delete the run's topics", "err", err)
		return
	}
	defer admin.Close()
	topics, err := admin.ListTopics()
	if err != nil {
		log.Warn("delete the run's topics", "err", err)
		return
	}
	for name := range topics {
		if strings.HasPrefix(name, run+"-") {
			if err := admin.DeleteTopic(name); err != nil {
				log.Warn("delete the run's topic", "topic", name, "err", err)
			}
		}
	}
}

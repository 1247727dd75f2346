package payments

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/metrics"
	"github.com/idemhq/idem/retrytopic"
)

// retryPolicy is where failing payments go after their in-process retries:
// three non-blocking retry tiers, then the dead-letter topic.
var retryPolicy = retrytopic.Policy{Delays: []time.Duration{time.Second, 10 * time.Second, time.Minute}}

// serveMain runs the consumer until SIGINT/SIGTERM.
func serveMain(ctx context.Context, args []string, stderr io.Writer, hooks Hooks) error {
	fs := flag.NewFlagSet("payments-consumer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	topic := fs.String("topic", "payments", "topic to consume (created when missing)")
	group := fs.String("group", "payments-consumer", "consumer group id")
	partitions := fs.Int("partitions", 6, "partitions of the topic when this service creates it")
	metricsAddr := fs.String("metrics-addr", ":9464", "listen address of /metrics, /healthz and /readyz (empty: off)")
	eventsTopic := fs.String("events-topic", defaultEventsTopic, "topic of the payment.recorded events (created when missing)")
	relay := fs.Bool("relay", true, "run the outbox relay in this process (false: run `idem outbox relay` apart)")
	verbose := fs.Bool("v", false, "debug logs")
	bf := bankFlags{timeout: 2 * time.Second, cooldown: 10 * time.Second} // no faults by default
	bf.register(fs)
	opts := addRunFlags(fs) // -mode, -retry-delays, -transactions, -instance-id (modes.go)
	if hooks.Flags != nil {
		hooks.Flags(fs)
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: payments-consumer [flags]      consume payments\n       payments-consumer demo [flags] run the end-to-end demo (demo -h)\n\nenv: KAFKA_BROKERS, DATABASE_URL\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q (the only subcommand is demo)", fs.Arg(0))
	}
	if *partitions < 1 {
		return usagef("-partitions must be >= 1")
	}
	if err := bf.validate(); err != nil {
		return err
	}
	e, err := loadEnv()
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := newLogger(stderr, level)

	// Each start-up step rides out a broker or database that is restarting
	// or not up yet (retryStart, up to a minute), as consumer.Run does for
	// its own steps; a bad URL, a refused login or bad SQL fails at once.
	var pool *pgxpool.Pool
	err = retryStart(ctx, log, "connecting to PostgreSQL", func(ctx context.Context) (err error) {
		pool, err = openDB(ctx, e.DatabaseURL)
		return err
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := retryStart(ctx, log, "migrating", func(ctx context.Context) error { return migrate(ctx, pool) }); err != nil {
		return err
	}

	scfg := saramaConfig("payments-consumer")
	for _, t := range []string{*topic, *eventsTopic} {
		err := retryStart(ctx, log, "creating topic "+t, func(ctx context.Context) error {
			return createTopic(ctx, e.Brokers, scfg, t, int32(*partitions), log)
		})
		if err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ready := consumer.NewReadiness()
	rl := eventsRelay(*relay, pool, e.Brokers, scfg, log, reg)
	if *metricsAddr != "" {
		ln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		stopMetrics := serveMetrics(ln, reg, readyFunc(ready, rl), log)
		defer stopMetrics()
	}

	svc, bk, err := startService(bf, reg, *eventsTopic)
	if err != nil {
		return err
	}
	defer bk.close()
	log.Info("bank", "url", bk.URL(), "faults", bf.faults.describe(), "limits", bf.describeLimits())

	log.Info("consuming", "topic", *topic, "group", *group, "brokers", e.Brokers,
		"dlq", retryPolicy.DLQ(*topic, *group), "metrics", *metricsAddr)
	err = opts.run(ctx, consumer.Config{
		Brokers: e.Brokers,
		Group:   *group,
		Topics:  []string{*topic},
		KeyFunc: paymentKey,
		// Run sweeps inbox keys older than Config.Retention.Keep (default 14
		// days, longer than the tiers' and the DLQ's retention) itself.
		Dedupe:     dedupe.NewPostgres(pool),
		Sarama:     scfg,
		Logger:     log,
		Registerer: reg,
		Retry:      consumer.RetryConfig{Tiers: retryPolicy, Rules: paymentRules()},
		Readiness:  ready,
	}, rl, pool, log, svc, hooks)
	if err != nil {
		return err // consumer.Run's errors say "consumer: " already
	}
	log.Info("stopped cleanly")
	return nil
}

// createTopic creates topic when it is missing (idem never creates source
// topics; it creates its retry and dead-letter topics itself).
func createTopic(ctx context.Context, brokers []string, scfg *sarama.Config, topic string, partitions int32, log *slog.Logger) error {
	client, err := sarama.NewClient(brokers, scfg)
	if err != nil {
		return fmt.Errorf("connect to Kafka %v: %w", brokers, err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		client.Close()
		return fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close() // closes client too
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	created, err := ensureTopic(wctx, client, admin, topic, partitions)
	if err != nil {
		return err
	}
	if created {
		log.Info("created topic", "topic", topic, "partitions", partitions)
	}
	return nil
}

// serveMetrics serves /metrics (reg), /healthz and /readyz (ready) on ln
// until the returned func is called.
func serveMetrics(ln net.Listener, reg prometheus.Gatherer, ready func(context.Context) error, log *slog.Logger) (stop func()) {
	srv := &http.Server{Handler: metrics.NewServeMux(reg, ready), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server", "err", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}
}

// startService starts the in-process bank with bf's faults and returns the
// handler's service, which charges it through a circuit breaker named "bank"
// with bf's flow limits, whose state and limits are exported on reg, and
// publishes payment.recorded events to eventsTopic. The caller closes the bank.
func startService(bf bankFlags, reg prometheus.Registerer, eventsTopic string) (*service, *bank, error) {
	onChange, err := consumer.BreakerMetrics(reg)
	if err != nil {
		return nil, nil, err
	}
	breakers, err := breaker.NewSet(breaker.Settings{OpenTimeout: bf.cooldown, OnStateChange: onChange})
	if err != nil {
		return nil, nil, err
	}
	requests, err := bf.setUpFlow(breakers, reg) // its limits and their metrics (flow.go)
	if err != nil {
		return nil, nil, err
	}
	bk, err := startBank(bf.faults, 2*bf.timeout)
	if err != nil {
		return nil, nil, err
	}
	client := &bankClient{url: bk.URL(), timeout: bf.timeout, breakers: breakers, requests: requests,
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}}
	return &service{bank: client, eventsTopic: eventsTopic}, bk, nil
}

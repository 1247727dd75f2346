package payments

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// demoRetry is the demo's retry policy: the same three tiers as the
// service, with delays short enough for a one-minute demo.
var demoRetry = retrytopic.Policy{Delays: []time.Duration{500 * time.Millisecond, 2 * time.Second, 5 * time.Second}}

// demoOptions configure one demo run.
type demoOptions struct {
	N          int           // unique good payments
	Dup        float64       // duplicate deliveries, as a fraction of N
	Bad        int           // deliberately bad payments (dead-lettered)
	Partitions int32         // partitions of the demo topic
	Rate       int           // records produced per second (0: as fast as possible)
	Timeout    time.Duration // bound on the whole run
	Cleanup    bool          // delete the run's topics and rows at the end
	Verbose    bool          // idem's info logs
	Bank       bankFlags     // the bank's faults, timeout and breaker cool-down

	MetricsAddr string       // where /metrics, /healthz, /readyz are served ("" off)
	Metrics     net.Listener // if set, used instead of MetricsAddr (tests)
	Progress    time.Duration
	GrafanaURL  string // probed; the dashboard link is printed when it answers

	// consumed, if set, is called once every record is committed, while the
	// consumer and the metrics endpoint are still up (tests scrape then).
	consumed func(ctx context.Context) error
}

func defaultDemoOptions() demoOptions {
	return demoOptions{
		N: 10000, Dup: 0.10, Bad: 20, Partitions: 6, Rate: 1000, Timeout: 5 * time.Minute,
		Bank: bankFlags{
			faults: bankFaults{FailureRate: 0.04, TimeoutRate: 0.01, Latency: time.Millisecond, Outages: []window{{3 * time.Second, 3 * time.Second}},
				Throttles: []window{{8 * time.Second, 2 * time.Second}}, RetryAfter: time.Second},
			timeout:  100 * time.Millisecond,
			cooldown: time.Second,
			limits:   demoBankLimits,
		},
		MetricsAddr: ":9464", Progress: 2 * time.Second, GrafanaURL: "http://127.0.0.1:3000",
	}
}

func demoMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultDemoOptions()
	fs := flag.NewFlagSet("payments-consumer demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.N, "n", o.N, "unique payments to produce (one order each)")
	fs.Float64Var(&o.Dup, "dup", o.Dup, "duplicate deliveries, as a fraction of -n")
	fs.IntVar(&o.Bad, "bad", o.Bad, "poison payments (unknown order, bad JSON, negative amount, unknown currency, no key)")
	partitions := fs.Int("partitions", int(o.Partitions), "partitions of the demo topic")
	fs.IntVar(&o.Rate, "rate", o.Rate, "records produced per second (0: all at once)")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "give up after this long")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "delete the run's topics and rows afterwards")
	fs.BoolVar(&o.Verbose, "v", false, "show idem's info logs")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", o.MetricsAddr, "listen address of /metrics, /healthz and /readyz (empty: off)")
	fs.DurationVar(&o.Progress, "progress", o.Progress, "interval of the progress lines when stdout is not a terminal")
	fs.StringVar(&o.GrafanaURL, "grafana", o.GrafanaURL, "Grafana to link the dashboard of, when it answers")
	o.Bank.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: payments-consumer demo [flags]\n\nProduces a stream of payments with duplicates, poison records and bank faults\nto a fresh topic, consumes it with idem, shows progress, and checks the\nfigures balance against PostgreSQL, Kafka and the bank.\n\nenv: KAFKA_BROKERS, DATABASE_URL\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Partitions = int32(*partitions)
	switch {
	case fs.NArg() > 0:
		return usagef("unexpected argument %q", fs.Arg(0))
	case o.N < 1, o.Dup < 0, o.Bad < 0, o.Partitions < 1, o.Rate < 0, o.Timeout <= 0, o.Progress <= 0:
		return usagef("need -n >= 1, -dup >= 0, -bad >= 0, -partitions >= 1, -rate >= 0, -timeout > 0, -progress > 0")
	}
	if err := o.Bank.validate(); err != nil {
		return err
	}
	e, err := loadEnv()
	if err != nil {
		return err
	}
	s, err := runDemo(ctx, e, o, stdout, stderr)
	if err != nil {
		return err
	}
	if err := s.check(); err != nil {
		fmt.Fprintf(stdout, "FAIL: the figures do not balance:\n%v\n", err)
		return errors.New("demo figures do not balance")
	}
	fmt.Fprintln(stdout, "OK: every payment applied and charged exactly once; every poison record is in the DLQ.")
	return nil
}

// runDemo runs one demo and returns its summary (printed to stdout). It
// returns an error when the run could not complete; the caller checks the
// summary balances.
func runDemo(ctx context.Context, e env, o demoOptions, stdout, stderr io.Writer) (summary, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, o.Timeout, fmt.Errorf("demo timed out after %s (-timeout)", o.Timeout))
	defer cancel()

	var s summary
	s.RunID = newRunID()
	s.Topic = "payments-demo-" + s.RunID
	s.Group = "payments-consumer-" + s.RunID
	s.DLQ = demoRetry.DLQ(s.Topic, s.Group)
	s.Tiers = demoRetry.Tiers(s.Topic, s.Group)
	s.Partitions = o.Partitions
	s.Outages = len(o.Bank.faults.Outages)
	fmt.Fprintf(stdout, "idem payments demo — topic %s (%d partitions), group %s\n", s.Topic, o.Partitions, s.Group)
	fmt.Fprintf(stdout, "  bank:     %s; %s; timeout %s; breaker opens after 5 failures in a row, for %s\n",
		o.Bank.faults.describe(), o.Bank.describeLimits(), o.Bank.timeout, o.Bank.cooldown)

	level := slog.LevelWarn
	if o.Verbose {
		level = slog.LevelInfo
	}
	logw := stderr
	if isTerminal(stdout) && isTerminal(stderr) {
		logw = clearingWriter{stderr}
	}
	log := newLogger(logw, level)

	pool, err := openDB(ctx, e.DatabaseURL)
	if err != nil {
		return s, err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return s, err
	}

	client, err := sarama.NewClient(e.Brokers, saramaConfig("payments-demo"))
	if err != nil {
		return s, fmt.Errorf("connect to Kafka %v: %w", e.Brokers, err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		client.Close()
		return s, fmt.Errorf("kafka admin: %w", err)
	}
	defer admin.Close() // closes client too
	if _, err := ensureTopic(ctx, client, admin, s.Topic, o.Partitions); err != nil {
		return s, err
	}
	s.Events.Topic = s.Topic + ".events"
	if _, err := ensureTopic(ctx, client, admin, s.Events.Topic, o.Partitions); err != nil {
		return s, err
	}
	if o.Cleanup {
		defer cleanupRun(pool, admin, s, stderr)
	}

	// 1. Seed one pending order per payment.
	stream := buildStream(s.RunID, o)
	s.Produced, s.GoodProduced, s.UniqueKeys, s.Bad = len(stream), stream.good(), o.N, o.Bad
	if err := seedOrders(ctx, pool, s.RunID, o.N); err != nil {
		return s, err
	}

	// 2. Metrics, the bank, the consumer.
	reg := prometheus.NewRegistry()
	ready := consumer.NewReadiness()
	dcfg := saramaConfig("payments-demo-consumer")
	rl := eventsRelay(true, pool, e.Brokers, dcfg, log, reg) // publishes payment.recorded from this process
	readyz := readyFunc(ready, rl)
	if ln := o.Metrics; ln != nil || o.MetricsAddr != "" {
		if ln == nil {
			ln, err = net.Listen("tcp", o.MetricsAddr)
		}
		if err != nil {
			fmt.Fprintf(stdout, "  metrics:  not served: %v\n", err) // a demo still runs beside another
		} else {
			stopMetrics := serveMetrics(ln, reg, readyz, log)
			defer stopMetrics()
			fmt.Fprintf(stdout, "  metrics:  http://%s/metrics (also /healthz, /readyz)\n", displayAddr(ln.Addr()))
		}
	}
	if url := dashboardURL(ctx, o.GrafanaURL); url != "" {
		fmt.Fprintf(stdout, "  dashboard: %s\n", url)
	}
	svc, bk, err := startService(o.Bank, reg, s.Events.Topic)
	if err != nil {
		return s, err
	}
	defer bk.close()

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runErr := make(chan error, 1)
	go func() {
		runErr <- consumer.Run(runCtx, consumer.Config{
			Brokers:    e.Brokers,
			Group:      s.Group,
			Topics:     []string{s.Topic},
			KeyFunc:    paymentKey,
			Dedupe:     dedupe.NewPostgres(pool),
			Sarama:     dcfg,
			Logger:     log,
			Registerer: reg,
			Retry: consumer.RetryConfig{
				Attempts: 2, Backoff: recovery.Backoff{Base: 20 * time.Millisecond},
				Tiers: demoRetry, Rules: paymentRules(),
			},
			DLQDepthInterval: time.Second,
			LagInterval:      time.Second,
			Readiness:        ready,
		}, handler.Func(svc.handlePayment))
	}()
	defer startRelay(runCtx, rl, log)()
	waitCtx, stopWait := context.WithCancel(ctx)
	defer stopWait()
	go func() { // a fatal Run error ends the waits at once
		select {
		case err := <-runErr:
			runErr <- err
			stopWait()
		case <-waitCtx.Done():
		}
	}()
	if err := waitReady(waitCtx, readyz); err != nil {
		return s, finish(runErr, stopRun, err)
	}

	// 3. Produce the stream at o.Rate while the progress shows; the bank's
	// outage windows count from here.
	bk.restartClock()
	start := time.Now()
	var sent, produceNanos atomic.Int64
	prodErr, prodDone := make(chan error, 1), make(chan struct{})
	defer func() { stopWait(); <-prodDone }() // the producer never outlives the demo
	go func() {
		defer close(prodDone)
		err := produce(waitCtx, e.Brokers, s.Topic, stream, o.Rate, &sent)
		produceNanos.Store(int64(time.Since(start)))
		prodErr <- err
	}()
	p := newProgress(stdout, o.Progress, int64(len(stream)), reg, s.Group)
	topics := append([]string{s.Topic}, s.Tiers...)
	werr := func() error {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		produced := false
		for {
			select {
			case err := <-prodErr:
				if err != nil {
					return err
				}
				produced = true
			case <-waitCtx.Done():
				return fmt.Errorf("waiting for group %s to commit %s and its retry tiers: %w", s.Group, s.Topic, context.Cause(waitCtx))
			case <-tick.C:
			}
			p.update(sent.Load())
			if left, err := lag(client, admin, s.Group, topics); err == nil && produced && left == 0 {
				return nil
			}
		}
	}()
	s.ConsumeTime = time.Since(start)
	s.ProduceTime = time.Duration(produceNanos.Load())
	p.done()
	if werr == nil { // the relay publishes each stored payment's event
		s.Events, werr = waitEvents(waitCtx, pool, client, s.Events.Topic)
	}
	if werr == nil && o.consumed != nil {
		werr = o.consumed(waitCtx)
	}
	if err := finish(runErr, stopRun, werr); err != nil {
		return s, err
	}

	// 4. Read the figures back.
	if err := readKafkaFigures(ctx, client, &s); err != nil {
		return s, err
	}
	if err := readFigures(ctx, pool, &s); err != nil {
		return s, err
	}
	s.Bank = bk.figures(s.RunID + "-")
	s.DoubleCharges += s.Bank.DoubleCharged
	s.NaturalDuplicates = svc.naturalDups.Load()
	g := gathered(reg)
	s.InboxDuplicates = g.sum("idem_messages_total", "outcome", "duplicate")
	s.InProcess = g.sum("idem_retries_total", "", "")
	s.DLQForwarded = g.sum("idem_forwarded_total", "destination", s.DLQ)
	for _, t := range s.Tiers {
		s.TierForwarded = append(s.TierForwarded, g.sum("idem_forwarded_total", "destination", t))
	}
	s.BreakerOpenings = g.sumWhere("idem_breaker_transitions_total", map[string]string{"name": "bank", "to": "open"})
	if err := readFlow(ctx, client, g, o.Bank, &s); err != nil {
		return s, err
	}
	s.print(stdout)
	return s, nil
}

// finish stops the consumer and returns the first error of werr and Run's.
func finish(runErr chan error, stopRun context.CancelFunc, werr error) error {
	stopRun()
	if err := <-runErr; err != nil {
		return err // consumer.Run's errors say "consumer: " already
	}
	return werr
}

// waitReady polls ready until the consumer has joined its group and the
// relay runs.
func waitReady(ctx context.Context, ready func(context.Context) error) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		err := ready(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("consumer not ready: %w (%v)", context.Cause(ctx), err)
		case <-t.C:
		}
	}
}

// displayAddr is addr as a URL host: "localhost:9464" for a listener on every
// interface.
func displayAddr(addr net.Addr) string {
	if a, ok := addr.(*net.TCPAddr); ok && a.IP.IsUnspecified() {
		return net.JoinHostPort("localhost", strconv.Itoa(a.Port))
	}
	return addr.String()
}

// dashboardURL returns the idem dashboard's URL when Grafana answers at base.
func dashboardURL(ctx context.Context, base string) string {
	if base == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(base, "/")+"/api/health", nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return ""
	}
	return strings.TrimRight(base, "/") + "/d/idem/idem?refresh=5s"
}

// newRunID is unique per run: unix seconds and 16 random bits, so runs in
// the same second (a test next to `make run`) do not collide.
func newRunID() string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%d-%s", time.Now().Unix(), hex.EncodeToString(b[:]))
}

// cleanupRun deletes the run's topics, rows and inbox entries.
func cleanupRun(pool *pgxpool.Pool, admin sarama.ClusterAdmin, s summary, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, t := range append(append([]string{s.Topic, s.Events.Topic}, s.Tiers...), s.DLQ) {
		if err := admin.DeleteTopic(t); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
			fmt.Fprintf(stderr, "cleanup: delete topic %s: %v\n", t, err)
		}
	}
	prefix := s.RunID + "-%"
	for _, q := range []struct{ sql, arg string }{
		{`DELETE FROM payments WHERE idempotency_key LIKE $1`, prefix},
		{`DELETE FROM orders WHERE id LIKE $1`, prefix},
		{`DELETE FROM idem_processed WHERE consumer_group = $1`, s.Group},
	} {
		if _, err := pool.Exec(ctx, q.sql, q.arg); err != nil {
			fmt.Fprintf(stderr, "cleanup: %v\n", err)
		}
	}
	if err := admin.DeleteConsumerGroup(s.Group); err != nil {
		fmt.Fprintf(stderr, "cleanup: delete group %s: %v\n", s.Group, err)
	}
}

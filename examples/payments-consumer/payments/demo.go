package payments

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
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/dlq"
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

// summary is what a demo run reads back from PostgreSQL, Kafka, the bank's
// ledger and idem's metrics.
type summary struct {
	RunID, Topic, Group, DLQ string
	Partitions               int32
	Tiers                    []string

	Produced     int // every record sent
	GoodProduced int // good payments sent, duplicates included
	UniqueKeys   int // distinct good idempotency keys (= orders seeded)
	Bad          int // bad records sent

	Stored        int64 // payments rows of this run (PostgreSQL)
	OrdersPaid    int64 // orders of this run with status paid (PostgreSQL)
	DoubleCharges int64 // orders with >1 payment + keys with >1 row (PostgreSQL) + orders charged twice (bank)

	InboxDuplicates   int64 // idem_messages_total{outcome="duplicate"}: stopped by the inbox
	NaturalDuplicates int64 // stopped by the payments table's UNIQUE key

	TierRecords   []int64 // records in each retry tier topic (Kafka)
	TierForwarded []int64 // idem_forwarded_total to each tier
	InProcess     int64   // idem_retries_total: in-process retries

	DeadLettered int64       // records in the dead-letter topic (Kafka)
	DLQGroups    []dlq.Group // the DLQ's records grouped by failure (Kafka)
	DLQForwarded int64       // idem_forwarded_total to the DLQ

	Bank            bankFigures
	BreakerOpenings int64 // idem_breaker_transitions_total{name="bank",to="open"}
	Outages         int   // outage windows configured

	ProduceTime, ConsumeTime time.Duration

	Events eventFigures // payment.recorded events published through the outbox (events.go)
	Flow   flowFigures  // the bank's rate limit and 429s (flow.go)
}

// DuplicatesSkipped is the good deliveries that had no second effect.
func (s summary) DuplicatesSkipped() int64 { return int64(s.GoodProduced) - s.Stored }

// check returns an error listing every figure that does not balance.
func (s summary) check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Stored != int64(s.UniqueKeys) {
		bad("payments stored %d != unique keys %d", s.Stored, s.UniqueKeys)
	}
	if s.OrdersPaid != int64(s.UniqueKeys) {
		bad("orders paid %d != unique orders %d", s.OrdersPaid, s.UniqueKeys)
	}
	if s.DuplicatesSkipped() != s.InboxDuplicates+s.NaturalDuplicates {
		bad("duplicates skipped %d != inbox %d + natural key %d", s.DuplicatesSkipped(), s.InboxDuplicates, s.NaturalDuplicates)
	}
	if s.Bank.ChargedPrefix != s.Stored {
		bad("bank charges %d != payments stored %d", s.Bank.ChargedPrefix, s.Stored)
	}
	if s.DeadLettered != int64(s.Bad) {
		bad("dead-lettered %d != bad payments %d", s.DeadLettered, s.Bad)
	}
	if s.DeadLettered != s.DLQForwarded {
		bad("DLQ records %d != idem_forwarded_total to the DLQ %d", s.DeadLettered, s.DLQForwarded)
	}
	var grouped int64
	for _, g := range s.DLQGroups {
		grouped += g.Count
	}
	if grouped != s.DeadLettered {
		bad("DLQ records by reason %d != DLQ records %d", grouped, s.DeadLettered)
	}
	for i := range s.TierRecords {
		if s.TierRecords[i] != s.TierForwarded[i] {
			bad("tier %d: %d records != idem_forwarded_total %d", i+1, s.TierRecords[i], s.TierForwarded[i])
		}
	}
	if s.DoubleCharges != 0 {
		bad("double charges %d != 0", s.DoubleCharges)
	}
	if err := s.Events.check(s.Stored); err != nil {
		errs = append(errs, err)
	}
	if err := s.Flow.check(s.Bank.Flow); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s summary) print(w io.Writer) {
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-19s "+format+"\n", append([]any{label + ":"}, args...)...)
	}
	rate := float64(s.Produced) / max(s.ConsumeTime.Seconds(), 0.001)
	line("produced", "%s records (%s payments + %s duplicate deliveries + %d poison) in %s",
		num(int64(s.Produced)), num(int64(s.UniqueKeys)), num(int64(s.GoodProduced-s.UniqueKeys)), s.Bad, s.ProduceTime.Round(time.Millisecond))
	line("consumed", "all committed %s after the first was sent = %s msgs/s (%d partitions, one transaction per message)",
		s.ConsumeTime.Round(time.Millisecond), num(int64(rate)), s.Partitions)
	line("unique", "%s payments, one order each", num(int64(s.UniqueKeys)))
	line("applied", "%s payments stored, %s orders paid, %s bank charges", num(s.Stored), num(s.OrdersPaid), num(s.Bank.ChargedPrefix))
	line("duplicates skipped", "%s (inbox %s, natural key %s)", num(s.DuplicatesSkipped()), num(s.InboxDuplicates), num(s.NaturalDuplicates))
	var tiers []string
	for i, n := range s.TierRecords {
		tiers = append(tiers, fmt.Sprintf("tier %d: %s", i+1, num(n)))
	}
	line("retried", "%s in-process; %s", num(s.InProcess), strings.Join(tiers, ", "))
	line("bank", "%s calls, %s failed or timed out, %s answered from its idempotency ledger",
		num(s.Bank.Calls), num(s.Bank.Failed), num(s.Bank.Repeats))
	line("breaker openings", "%d (bank outages configured: %d)", s.BreakerOpenings, s.Outages)
	s.Flow.print(line, s.Bank.Flow)
	line("dead-lettered", "%s in %s", num(s.DeadLettered), s.DLQ)
	for _, g := range s.DLQGroups {
		msg := g.Message
		if len(msg) > 60 {
			msg = msg[:57] + "..."
		}
		fmt.Fprintf(w, "  %21s %4d  %-11s %s\n", "", g.Count, g.Kind, msg)
	}
	line("events published", "%s", s.Events)
	line("double charges", "%d", s.DoubleCharges)
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
		return fmt.Errorf("consumer: %w", err)
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

// readKafkaFigures counts the records of the run's tier and dead-letter
// topics and groups the dead letters by failure (as `idem dlq list` does).
func readKafkaFigures(ctx context.Context, client sarama.Client, s *summary) error {
	var err error
	for _, t := range s.Tiers {
		n, err := countRecords(client, t)
		if err != nil {
			return fmt.Errorf("count records of %s: %w", t, err)
		}
		s.TierRecords = append(s.TierRecords, n)
	}
	if s.DeadLettered, err = countRecords(client, s.DLQ); err != nil {
		return fmt.Errorf("count DLQ records: %w", err)
	}
	if s.DLQGroups, err = dlq.New(client).List(ctx, s.DLQ); err != nil {
		return fmt.Errorf("list DLQ: %w", err)
	}
	return nil
}

// newRunID is unique per run: unix seconds and 16 random bits, so runs in
// the same second (a test next to `make run`) do not collide.
func newRunID() string {
	var b [2]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%d-%s", time.Now().Unix(), hex.EncodeToString(b[:]))
}

func orderID(run string, i int) string { return fmt.Sprintf("%s-order-%06d", run, i) }
func payKey(run string, i int) string  { return fmt.Sprintf("%s-pay-%06d", run, i) }

// record is one Kafka record of the demo stream.
type record struct {
	kafkaKey string // "" → no key (any partition)
	key      string // idempotency-key header; "" → none
	value    []byte
	good     bool
}

type stream []record

func (st stream) good() int {
	n := 0
	for _, r := range st {
		if r.good {
			n++
		}
	}
	return n
}

// buildStream makes o.N good payments (one per order), round(o.N*o.Dup)
// duplicate deliveries of random ones, and o.Bad bad records, shuffled.
// Half the duplicates keep the order id as Kafka key (same partition, like a
// producer retry); the other half have no Kafka key and may land on another
// partition, so two consumers race on the same idempotency key.
func buildStream(run string, o demoOptions) stream {
	rnd := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	currs := []string{"KRW", "USD", "EUR", "JPY"}
	st := make(stream, 0, o.N+int(float64(o.N)*o.Dup+0.5)+o.Bad)
	for i := 1; i <= o.N; i++ {
		p := Payment{
			IdempotencyKey: payKey(run, i), OrderID: orderID(run, i), Currency: currs[rnd.IntN(len(currs))],
			Amount: Amount(fmt.Sprintf("%d.%02d", 1+rnd.IntN(100000), rnd.IntN(100))),
		}
		v, _ := json.Marshal(p)
		st = append(st, record{kafkaKey: p.OrderID, key: p.IdempotencyKey, value: v, good: true})
	}
	dups := int(float64(o.N)*o.Dup + 0.5)
	for d := range dups {
		r := st[rnd.IntN(o.N)]
		if d%2 == 1 {
			r.kafkaKey = ""
		}
		st = append(st, r)
	}
	for b := range o.Bad {
		key := fmt.Sprintf("%s-bad-%04d", run, b)
		var v string
		hdr := key
		switch b % 5 {
		case 0: // an order that does not exist
			v = fmt.Sprintf(`{"idempotency_key":%q,"order_id":"%s-order-missing-%d","amount":"10.00","currency":"KRW"}`, key, run, b)
		case 1: // poison bytes
			v = `{"idempotency_key":"` + key + `","order_id":` // truncated JSON
		case 2: // a refund disguised as a payment
			v = fmt.Sprintf(`{"idempotency_key":%q,"order_id":%q,"amount":"-5.00","currency":"USD"}`, key, orderID(run, 1+b%o.N))
		case 3: // a currency the service does not take
			v = fmt.Sprintf(`{"idempotency_key":%q,"order_id":%q,"amount":"7.50","currency":"XYZ"}`, key, orderID(run, 1+b%o.N))
		case 4: // no idempotency key anywhere
			v = fmt.Sprintf(`{"order_id":%q,"amount":"3.00","currency":"EUR"}`, orderID(run, 1+b%o.N))
			hdr = ""
		}
		st = append(st, record{kafkaKey: key, key: hdr, value: []byte(v)})
	}
	rnd.Shuffle(len(st), func(i, j int) { st[i], st[j] = st[j], st[i] })
	return st
}

// seedOrders inserts n pending orders for run.
func seedOrders(ctx context.Context, pool *pgxpool.Pool, run string, n int) error {
	rows := make([][]any, n)
	for i := range rows {
		rows[i] = []any{orderID(run, i+1)}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"id"}, pgx.CopyFromRows(rows)); err != nil {
		return fmt.Errorf("seed orders: %w", err)
	}
	return nil
}

// produce sends st to topic with an idempotent, acks=all producer, rate
// records a second (all at once when rate is 0), counting them in sent.
func produce(ctx context.Context, brokers []string, topic string, st stream, rate int, sent *atomic.Int64) error {
	cfg := saramaConfig("payments-demo-producer")
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Idempotent = true
	cfg.Net.MaxOpenRequests = 1
	cfg.Producer.Retry.Max = 10
	p, err := sarama.NewSyncProducer(brokers, cfg)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer p.Close()
	// Batches of a tenth of a second's worth, each sent when it is due.
	batch, every := 1000, time.Duration(0)
	if rate > 0 {
		batch, every = max(1, rate/10), time.Duration(float64(time.Second)*float64(max(1, rate/10))/float64(rate))
	}
	start := time.Now()
	for i, n := 0, 0; i < len(st); i, n = i+batch, n+1 {
		if wait := time.Until(start.Add(time.Duration(n) * every)); wait > 0 {
			select {
			case <-ctx.Done():
				return fmt.Errorf("produce: %w", context.Cause(ctx))
			case <-time.After(wait):
			}
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("produce: %w", context.Cause(ctx))
		}
		msgs := make([]*sarama.ProducerMessage, 0, batch)
		for _, r := range st[i:min(i+batch, len(st))] {
			m := &sarama.ProducerMessage{Topic: topic, Value: sarama.ByteEncoder(r.value)}
			if r.kafkaKey != "" {
				m.Key = sarama.StringEncoder(r.kafkaKey)
			}
			if r.key != "" {
				m.Headers = []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(r.key)}}
			}
			msgs = append(msgs, m)
		}
		if err := p.SendMessages(msgs); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		sent.Add(int64(len(msgs)))
	}
	return nil
}

// readFigures fills the PostgreSQL figures of s, scoped to its run.
func readFigures(ctx context.Context, pool *pgxpool.Pool, s *summary) error {
	prefix := s.RunID + "-%"
	err := pool.QueryRow(ctx, `
		SELECT
		  (SELECT count(*) FROM payments WHERE idempotency_key LIKE $1),
		  (SELECT count(*) FROM orders WHERE id LIKE $1 AND status = 'paid'),
		  (SELECT count(*) FROM (SELECT order_id FROM payments WHERE order_id LIKE $1
		                          GROUP BY order_id HAVING count(*) > 1) o)
		+ (SELECT count(*) FROM (SELECT idempotency_key FROM payments WHERE idempotency_key LIKE $1
		                          GROUP BY idempotency_key HAVING count(*) > 1) k)`,
		prefix).Scan(&s.Stored, &s.OrdersPaid, &s.DoubleCharges)
	if err != nil {
		return fmt.Errorf("read figures: %w", err)
	}
	return nil
}

// gatheredMetrics is one Gather of a registry.
type gatheredMetrics []*dto.MetricFamily

// gathered gathers reg (nil on error: every sum is then 0).
func gathered(reg prometheus.Gatherer) gatheredMetrics {
	mfs, _ := reg.Gather()
	return mfs
}

// sum adds up the counter or gauge name over the series whose label has
// value (every series when label is "").
func (g gatheredMetrics) sum(name, label, value string) int64 {
	if label == "" {
		return g.sumWhere(name, nil)
	}
	return g.sumWhere(name, map[string]string{label: value})
}

// find returns the value of the first series of name whose label has value.
func (g gatheredMetrics) find(name, label, value string) (int64, bool) {
	for _, mf := range g {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return int64(m.GetCounter().GetValue() + m.GetGauge().GetValue()), true
				}
			}
		}
	}
	return 0, false
}

// sumWhere adds up the counter or gauge name over the series whose labels
// include want.
func (g gatheredMetrics) sumWhere(name string, want map[string]string) int64 {
	return int64(g.sumFloat(name, want))
}

// sumFloat is sumWhere without rounding.
func (g gatheredMetrics) sumFloat(name string, want map[string]string) float64 {
	var sum float64
	for _, mf := range g {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			n := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok {
					if v != l.GetValue() {
						continue series
					}
					n++
				}
			}
			if n != len(want) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
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

// num formats n with thousands separators: 10000 → "10,000".
func num(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

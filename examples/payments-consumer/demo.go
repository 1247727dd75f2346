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
	"maps"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
)

// demoOptions configure one demo run.
type demoOptions struct {
	N          int           // unique good payments
	Dup        float64       // duplicate deliveries, as a fraction of N
	Bad        int           // deliberately bad payments (dead-lettered)
	Partitions int32         // partitions of the demo topic
	Timeout    time.Duration // bound on the whole run
	Cleanup    bool          // delete the run's topics and rows at the end
	Verbose    bool          // idem's info logs
}

func defaultDemoOptions() demoOptions {
	return demoOptions{N: 10000, Dup: 0.10, Bad: 20, Partitions: 6, Timeout: 5 * time.Minute}
}

// summary is what a demo run reads back from PostgreSQL and Kafka.
type summary struct {
	RunID, Topic, Group, DLQ string
	Partitions               int32

	Produced     int // every record sent
	GoodProduced int // good payments sent, duplicates included
	UniqueKeys   int // distinct good idempotency keys (= orders seeded)
	Bad          int // bad records sent

	Stored        int64 // payments rows of this run
	OrdersPaid    int64 // orders of this run with status paid
	DeadLettered  int64 // records in the dead-letter topic
	DoubleCharges int64 // orders with >1 payment + keys with >1 row

	IdemDuplicates int64            // idem_messages_total{outcome="duplicate"}
	DLQKinds       map[string]int64 // idem_forwarded_total to the DLQ, by idem-error-kind

	ProduceTime, ConsumeTime time.Duration

	Events eventFigures // payment.recorded events published through the outbox (events.go)
}

// DuplicatesSkipped is the good deliveries that had no second effect.
func (s summary) DuplicatesSkipped() int64 { return int64(s.GoodProduced) - s.Stored }

// check returns an error listing every figure that does not balance.
func (s summary) check() error {
	var errs []error
	if s.Stored != int64(s.UniqueKeys) {
		errs = append(errs, fmt.Errorf("payments stored %d != unique keys %d", s.Stored, s.UniqueKeys))
	}
	if s.OrdersPaid != int64(s.UniqueKeys) {
		errs = append(errs, fmt.Errorf("orders paid %d != unique orders %d", s.OrdersPaid, s.UniqueKeys))
	}
	if s.DeadLettered != int64(s.Bad) {
		errs = append(errs, fmt.Errorf("dead-lettered %d != bad payments %d", s.DeadLettered, s.Bad))
	}
	if s.DoubleCharges != 0 {
		errs = append(errs, fmt.Errorf("double charges %d != 0", s.DoubleCharges))
	}
	if err := s.Events.check(s.Stored); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s summary) print(w io.Writer) {
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-20s "+format+"\n", append([]any{label + ":"}, args...)...)
	}
	rate := float64(s.Produced) / s.ConsumeTime.Seconds()
	line("produced", "%s records (%s payments + %s duplicate deliveries + %d bad) in %s",
		num(int64(s.Produced)), num(int64(s.UniqueKeys)), num(int64(s.GoodProduced-s.UniqueKeys)), s.Bad, s.ProduceTime.Round(time.Millisecond))
	line("consumed", "all of them in %s = %s msgs/s (%d partitions, one transaction per message)",
		s.ConsumeTime.Round(time.Millisecond), num(int64(rate)), s.Partitions)
	line("unique keys", "%s", num(int64(s.UniqueKeys)))
	line("payments stored", "%s", num(s.Stored))
	line("duplicates skipped", "%s (idem's inbox counted %s)", num(s.DuplicatesSkipped()), num(s.IdemDuplicates))
	line("orders paid", "%s", num(s.OrdersPaid))
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(s.DLQKinds)) {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, s.DLQKinds[k]))
	}
	line("dead-lettered", "%s (%s) in %s", num(s.DeadLettered), strings.Join(kinds, ", "), s.DLQ)
	line("double charges", "%d", s.DoubleCharges)
	line("events published", "%s", s.Events)
}

func demoMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultDemoOptions()
	fs := flag.NewFlagSet("payments-consumer demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.N, "n", o.N, "unique payments to produce")
	fs.Float64Var(&o.Dup, "dup", o.Dup, "duplicate deliveries, as a fraction of -n")
	fs.IntVar(&o.Bad, "bad", o.Bad, "deliberately bad payments (unknown order, bad JSON, negative amount, unknown currency, no key)")
	partitions := fs.Int("partitions", int(o.Partitions), "partitions of the demo topic")
	fs.DurationVar(&o.Timeout, "timeout", o.Timeout, "give up after this long")
	fs.BoolVar(&o.Cleanup, "cleanup", false, "delete the run's topics and rows afterwards")
	fs.BoolVar(&o.Verbose, "v", false, "show idem's info logs")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: payments-consumer demo [flags]\n\nProduces payments with duplicates and bad records to a fresh topic, consumes\nthem with idem until every offset is committed, and checks the figures balance.\n\nenv: KAFKA_BROKERS, DATABASE_URL\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Partitions = int32(*partitions)
	switch {
	case fs.NArg() > 0:
		return usagef("unexpected argument %q", fs.Arg(0))
	case o.N < 1, o.Dup < 0, o.Bad < 0, o.Partitions < 1, o.Timeout <= 0:
		return usagef("need -n >= 1, -dup >= 0, -bad >= 0, -partitions >= 1, -timeout > 0")
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
	fmt.Fprintln(stdout, "OK: every payment applied exactly once; every bad one is in the DLQ.")
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
	s.DLQ = retryPolicy.DLQ(s.Topic, s.Group)
	s.Partitions = o.Partitions
	fmt.Fprintf(stdout, "idem payments demo — topic %s (%d partitions), group %s\n", s.Topic, o.Partitions, s.Group)

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

	// 1. Seed one pending order per payment, then produce the stream.
	stream := buildStream(s.RunID, o)
	s.Produced, s.GoodProduced, s.UniqueKeys, s.Bad = len(stream), stream.good(), o.N, o.Bad
	if err := seedOrders(ctx, pool, s.RunID, o.N); err != nil {
		return s, err
	}
	start := time.Now()
	if err := produce(ctx, e.Brokers, s.Topic, stream); err != nil {
		return s, err
	}
	s.ProduceTime = time.Since(start)

	// 2. Consume in-process until the group has committed every record.
	level := slog.LevelWarn
	if o.Verbose {
		level = slog.LevelInfo
	}
	reg := prometheus.NewRegistry()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runErr := make(chan error, 1)
	start = time.Now()
	go func() {
		runErr <- consumer.Run(runCtx, consumer.Config{
			Brokers:    e.Brokers,
			Group:      s.Group,
			Topics:     []string{s.Topic},
			KeyFunc:    paymentKey,
			Dedupe:     dedupe.NewPostgres(pool),
			Sarama:     saramaConfig("payments-demo-consumer"),
			Logger:     newLogger(stderr, level),
			Registerer: reg,
			Retry:      retryPolicy,
			Relay:      eventsRelay(true, pool), // publishes payment.recorded from this process
		}, paymentHandler(s.Events.Topic))
	}()
	topics := append([]string{s.Topic}, retryPolicy.Tiers(s.Topic, s.Group)...)
	waitCtx, stopWait := context.WithCancel(ctx)
	go func() { // a fatal Run error ends the wait at once
		select {
		case err := <-runErr:
			runErr <- err
			stopWait()
		case <-waitCtx.Done():
		}
	}()
	werr := waitCommitted(waitCtx, client, admin, s.Group, topics, nil)
	if werr == nil {
		s.Events, werr = waitEvents(waitCtx, pool, client, s.Events.Topic)
	}
	stopWait()
	s.ConsumeTime = time.Since(start)
	stopRun()
	if err := <-runErr; err != nil {
		return s, fmt.Errorf("consumer: %w", err)
	}
	if werr != nil {
		return s, werr
	}

	// 3. Read the figures back.
	if s.DeadLettered, err = countRecords(client, s.DLQ); err != nil {
		return s, fmt.Errorf("count DLQ records: %w", err)
	}
	if err := readFigures(ctx, pool, &s); err != nil {
		return s, err
	}
	s.IdemDuplicates = gatherCounter(reg, "idem_messages_total", "outcome", "duplicate")
	s.DLQKinds = dlqKinds(reg, s.DLQ)
	s.print(stdout)
	return s, nil
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

// produce sends st to topic with an idempotent, acks=all producer.
func produce(ctx context.Context, brokers []string, topic string, st stream) error {
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
	const batch = 1000
	for i := 0; i < len(st); i += batch {
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

// gatherCounter sums the counter name over the series whose label has value.
func gatherCounter(reg *prometheus.Registry, name, label, value string) int64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return int64(sum)
}

// dlqKinds is idem_forwarded_total{destination=dlq} by kind.
func dlqKinds(reg *prometheus.Registry, dlq string) map[string]int64 {
	kinds := map[string]int64{}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "idem_forwarded_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var dest, kind string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "destination":
					dest = l.GetValue()
				case "kind":
					kind = l.GetValue()
				}
			}
			if dest == dlq {
				kinds[kind] += int64(m.GetCounter().GetValue())
			}
		}
	}
	return kinds
}

// cleanupRun deletes the run's topics, rows and inbox entries.
func cleanupRun(pool *pgxpool.Pool, admin sarama.ClusterAdmin, s summary, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, t := range append(append([]string{s.Topic, s.Events.Topic}, retryPolicy.Tiers(s.Topic, s.Group)...), s.DLQ) {
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

package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/outbox"
)

// The outbox relay benchmark (make bench runs it after the consumer
// scenarios; -only outbox runs it alone; -outbox-duration 0 skips it):
//
//   - latency from COMMIT of a one-event transaction to the record being
//     fetched by a Kafka consumer, with the relay woken by LISTEN/NOTIFY, at
//     each of -outbox-rates events/s (writers pace themselves to the offered
//     rate; the achieved commit rate is reported beside it);
//   - relay throughput: a backlog of -outbox-rows rows published from the
//     table to Kafka (keys k0…k4999), against raw sarama producing the same
//     records with the relay's producer settings (idempotent, acks=all).
//
// Writers, relay and consumer share this process (and the machine's cores
// with Kafka and PostgreSQL).

// outboxLatency is one rate's latency figures.
type outboxLatency struct {
	OfferedRate  float64 `json:"offered_rate"`
	PerCommit    int     `json:"events_per_commit"`
	AchievedRate float64 `json:"achieved_rate"`
	Events       int     `json:"events"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
}

// outboxReport is the JSON written to <out>/outbox-<date>.json.
type outboxReport struct {
	StartedAt          time.Time       `json:"started_at"`
	Size               int             `json:"size"`
	Partitions         int             `json:"partitions"`
	Latency            []outboxLatency `json:"latency"`
	Rows               int             `json:"rows"`
	RelayPerSec        float64         `json:"relay_events_per_sec"`
	RawProducerPerSec  float64         `json:"raw_producer_per_sec"`
	RelayVsRawProducer float64         `json:"relay_vs_raw_producer"`
}

type outboxBench struct {
	o     options
	k     *kafka
	pool  *pgxpool.Pool
	topic string
	value []byte
}

func runOutboxBench(ctx context.Context, o options) error {
	rates, err := parseRates(o.outboxRates)
	if err != nil {
		return err
	}
	k, err := dialKafka()
	if err != nil {
		return err
	}
	defer k.close()
	runID := time.Now().UTC().Format("20060102t150405")
	pool, drop, err := outboxSchema(ctx, "idem_bench_outbox_"+runID)
	if err != nil {
		return err
	}
	defer drop()
	b := &outboxBench{o: o, k: k, pool: pool, value: make([]byte, o.size)}
	rep := outboxReport{StartedAt: time.Now().UTC(), Size: o.size, Partitions: o.partitions, Rows: o.outboxRows}
	defer k.deleteTopics(nil, "idem-bench-outbox-"+runID)

	for _, rate := range rates {
		b.topic = fmt.Sprintf("idem-bench-outbox-%s-lat-%d", runID, int(rate))
		if err := k.createTopic(ctx, b.topic, o.partitions); err != nil {
			return err
		}
		logf("outbox: latency at %s events/s for %s", thousands(rate), o.outboxDuration)
		l, err := b.latency(ctx, rate)
		if err != nil {
			return fmt.Errorf("outbox latency at %v/s: %w", rate, err)
		}
		logf("  achieved %s events/s; p50 %.1f ms, p99 %.1f ms, max %.1f ms", thousands(l.AchievedRate), l.P50Ms, l.P99Ms, l.MaxMs)
		rep.Latency = append(rep.Latency, l)
	}

	b.topic = fmt.Sprintf("idem-bench-outbox-%s-thr", runID)
	if err := k.createTopic(ctx, b.topic, o.partitions); err != nil {
		return err
	}
	logf("outbox: relay throughput, %d rows", o.outboxRows)
	if rep.RelayPerSec, err = b.relayThroughput(ctx, o.outboxRows); err != nil {
		return fmt.Errorf("outbox throughput: %w", err)
	}
	b.topic = fmt.Sprintf("idem-bench-outbox-%s-raw", runID)
	if err := k.createTopic(ctx, b.topic, o.partitions); err != nil {
		return err
	}
	if rep.RawProducerPerSec, err = b.rawThroughput(ctx, o.outboxRows); err != nil {
		return fmt.Errorf("raw producer throughput: %w", err)
	}
	rep.RelayVsRawProducer = rep.RelayPerSec / rep.RawProducerPerSec
	fmt.Print(rep.table())
	name := filepath.Join(o.out, "outbox-"+rep.StartedAt.Format("2006-01-02")+".json")
	j, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(name, append(j, '\n'), 0o644); err != nil {
		return err
	}
	logf("outbox: wrote %s", name)
	return nil
}

func parseRates(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("-outbox-rates: %q is not a positive rate", f)
		}
		out = append(out, r)
	}
	return out, nil
}

// outboxSchema creates schema and returns a pool whose search_path is it,
// and a func that drops it.
func outboxSchema(ctx context.Context, schema string) (*pgxpool.Pool, func(), error) {
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return nil, nil, errors.New("DATABASE_URL is not set (run through `make bench`, which reads .state/services.env)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	admin, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		admin.Close(ctx)
		return nil, nil, fmt.Errorf("create schema: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	drop := func() {
		if pool != nil {
			pool.Close()
		}
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = admin.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		admin.Close(dctx)
	}
	if err == nil {
		err = outboxstore.Migrate(ctx, pool)
	}
	if err != nil {
		drop()
		return nil, nil, fmt.Errorf("outbox schema: %w", err)
	}
	return pool, drop, nil
}

// startRelay runs a relay on b.pool until the returned stop is called.
func (b *outboxBench) startRelay() (stop func() error) {
	cfg := adminConfig()
	cfg.ClientID = "idem-bench-relay"
	r := &outbox.Relay{Pool: b.pool, Brokers: brokers(), Sarama: cfg,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() error {
		cancel()
		return <-done
	}
}

// fetcher reads b.topic from its end offsets and calls seen with each
// record's key and fetch time until stop is called.
func (b *outboxBench) fetcher(seen func(key []byte, at time.Time)) (stop func(), err error) {
	cfg := adminConfig()
	cfg.Consumer.Fetch.Min = 1
	cfg.Consumer.MaxWaitTime = 100 * time.Millisecond
	c, err := sarama.NewConsumer(brokers(), cfg)
	if err != nil {
		return nil, err
	}
	parts, err := c.Partitions(b.topic)
	if err != nil {
		c.Close()
		return nil, err
	}
	var wg sync.WaitGroup
	var pcs []sarama.PartitionConsumer
	for _, p := range parts {
		var pc sarama.PartitionConsumer
		for try := 0; ; try++ { // a new topic's leaders may not be known yet
			if pc, err = c.ConsumePartition(b.topic, p, sarama.OffsetOldest); err == nil || try == 50 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		pcs = append(pcs, pc)
		wg.Go(func() {
			for m := range pc.Messages() {
				seen(m.Key, time.Now())
			}
		})
	}
	return func() {
		for _, pc := range pcs {
			pc.AsyncClose()
		}
		wg.Wait()
		c.Close()
	}, nil
}

// latency offers rate one-event transactions per second for
// -outbox-duration (plus -latency-warmup, left out) and measures commit →
// fetched for each event.
func (b *outboxBench) latency(ctx context.Context, rate float64) (outboxLatency, error) {
	warm := int(rate * b.o.latWarmup.Seconds())
	total := warm + int(rate*b.o.outboxDuration.Seconds())
	committed := make([]atomic.Int64, total)
	fetched := make([]atomic.Int64, total)
	var got atomic.Int64
	stopFetch, err := b.fetcher(func(key []byte, at time.Time) {
		if i, err := strconv.Atoi(string(key)); err == nil && i < total && fetched[i].CompareAndSwap(0, at.UnixNano()) {
			got.Add(1)
		}
	})
	if err != nil {
		return outboxLatency{}, err
	}
	defer stopFetch()
	stopRelay := b.startRelay()

	// Writers pace themselves: transaction j, holding events j*per … j*per+per-1,
	// is due at start + j*per/rate. Above 2,000 events/s a transaction holds
	// several events (one process cannot commit much faster on a shared
	// 2-core machine), as a batch-mode handler's would.
	per := max(1, int(rate/2000))
	start := time.Now().Add(100 * time.Millisecond)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			for {
				first := int(next.Add(1)-1) * per
				if first >= total || ctx.Err() != nil {
					return
				}
				time.Sleep(time.Until(start.Add(time.Duration(float64(first) / rate * float64(time.Second))))) // pacing the load
				var msgs []outbox.Message
				for i := first; i < min(first+per, total); i++ {
					msgs = append(msgs, outbox.Message{Topic: b.topic, Key: []byte(strconv.Itoa(i)), Value: b.value})
				}
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return outbox.Enqueue(ctx, tx, msgs...) })
				if err != nil {
					errs <- err
					return
				}
				now := time.Now().UnixNano()
				for i := first; i < min(first+per, total); i++ {
					committed[i].Store(now)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		_ = stopRelay()
		return outboxLatency{}, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for got.Load() < int64(total) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond) // waiting for the tail of the load
	}
	if err := stopRelay(); err != nil {
		return outboxLatency{}, err
	}
	if n := got.Load(); n < int64(total) {
		return outboxLatency{}, fmt.Errorf("%d of %d events fetched within 2 minutes", n, total)
	}
	var lats []time.Duration
	first, last := int64(0), int64(0)
	for i := warm; i < total; i++ {
		c, f := committed[i].Load(), fetched[i].Load()
		lats = append(lats, time.Duration(max(0, f-c)))
		if first == 0 || c < first {
			first = c
		}
		last = max(last, c)
	}
	slices.Sort(lats)
	l := outboxLatency{OfferedRate: rate, PerCommit: per, Events: len(lats), P50Ms: ms(quantile(lats, 0.50)), P99Ms: ms(quantile(lats, 0.99)), MaxMs: ms(lats[len(lats)-1])}
	if last > first {
		l.AchievedRate = float64(len(lats)-1) / time.Duration(last-first).Seconds()
	}
	return l, nil
}

// relayThroughput inserts a backlog of rows (relay stopped), then times the
// relay publishing them all.
func (b *outboxBench) relayThroughput(ctx context.Context, rows int) (float64, error) {
	if _, err := b.pool.Exec(ctx, `INSERT INTO idem_outbox (topic, key, value)
		SELECT $1, convert_to('k' || (i % $3), 'UTF8'), $2 FROM generate_series(1, $4) i`, b.topic, b.value, keyCount, rows); err != nil {
		return 0, fmt.Errorf("insert backlog: %w", err)
	}
	var got atomic.Int64
	all := make(chan struct{})
	stopFetch, err := b.fetcher(func([]byte, time.Time) {
		if got.Add(1) == int64(rows) {
			close(all)
		}
	})
	if err != nil {
		return 0, err
	}
	defer stopFetch()
	start := time.Now()
	stopRelay := b.startRelay()
	select {
	case <-all:
	case <-time.After(5 * time.Minute):
	case <-ctx.Done():
	}
	elapsed := time.Since(start)
	if err := stopRelay(); err != nil {
		return 0, err
	}
	if n := got.Load(); n < int64(rows) {
		return 0, fmt.Errorf("%d of %d rows published within 5 minutes", n, rows)
	}
	return float64(rows) / elapsed.Seconds(), nil
}

// rawThroughput produces rows records straight to Kafka with the relay's
// producer settings and times the acks.
func (b *outboxBench) rawThroughput(ctx context.Context, rows int) (float64, error) {
	cfg := outboxstore.ProducerConfig(adminConfig())
	p, err := sarama.NewAsyncProducer(brokers(), cfg)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range rows {
			p.Input() <- &sarama.ProducerMessage{Topic: b.topic, Key: sarama.StringEncoder("k" + strconv.Itoa(i%keyCount)), Value: sarama.ByteEncoder(b.value)}
		}
	})
	var failed error
	for range rows { // every record ends in Successes or Errors
		select {
		case <-p.Successes():
		case e := <-p.Errors():
			failed = cmp.Or(failed, error(e.Err))
		}
	}
	elapsed := time.Since(start)
	wg.Wait()
	if err := cmp.Or(failed, p.Close()); err != nil {
		return 0, err
	}
	return float64(rows) / elapsed.Seconds(), nil
}

// table is the outbox report as Markdown.
func (r outboxReport) table() string {
	var sb strings.Builder
	w := io.Writer(&sb)
	fmt.Fprintf(w, "\nOutbox relay: COMMIT → fetched from Kafka (LISTEN/NOTIFY), %d-byte events, %d partitions\n\n", r.Size, r.Partitions)
	fmt.Fprintln(w, "| offered events/s | events per commit | achieved events/s | events | p50 ms | p99 ms | max ms |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|")
	for _, l := range r.Latency {
		fmt.Fprintf(w, "| %s | %d | %s | %s | %.1f | %.1f | %.1f |\n", thousands(l.OfferedRate), l.PerCommit, thousands(l.AchievedRate), thousands(float64(l.Events)), l.P50Ms, l.P99Ms, l.MaxMs)
	}
	fmt.Fprintf(w, "\nRelay throughput (%s rows, %d keys): %s events/s; raw sarama producer, same settings: %s records/s (relay %.2f× raw)\n",
		thousands(float64(r.Rows)), keyCount, thousands(r.RelayPerSec), thousands(r.RawProducerPerSec), r.RelayVsRawProducer)
	return sb.String()
}

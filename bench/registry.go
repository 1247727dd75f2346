package main

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/wire"
)

// Scenario is one consumer measured by the harness. Adding one is a call to
// register in scenarios.go: a name, a record limit, and a Consume function.
type Scenario struct {
	// Name is the row's name in the table, the JSON and the chart; -only and
	// -profile select scenarios by it or by its slug.
	Name string
	// Limit is how many records one run consumes (its quota); 0 means every
	// record of the topic. It is capped at -records.
	Limit int
	// PG marks a scenario that needs PostgreSQL; its ratio to the naive loop
	// is reported.
	PG bool
	// Naive marks the naive loop, the baseline of the PG ratios.
	Naive bool
	// Ceiling marks raw sarama and raw kgo, the two baselines every
	// throughput ratio is given against.
	Ceiling ceiling
	// Versus names another scenario this one is compared with (the "vs
	// other" column), e.g. "idem 2 ms" for its 16-lane variant.
	Versus string
	// Goal is the least ratio to Versus this scenario aims at (e.g. idem
	// with the memory store ≥ 1.0 × the hand-written dedupe loop); the
	// report's cost section says whether the run met it. 0: none.
	Goal float64
	// NoKafka marks a scenario that reads no Kafka (PostgreSQL alone): it
	// has no latency run and no ratio to the Kafka ceilings.
	NoKafka bool
	// Breakdown splits, in the latency run, each record's time into the
	// phases of a batch seen from outside the consumer (breakdown.go); the
	// report gives where the slowest 1 % spend it. P99Goal, if set, is the
	// bound the report compares the latency run's p99 with.
	Breakdown bool
	P99Goal   time.Duration
	// Extra keeps the scenario out of the default run; -only still selects it.
	Extra bool
	// Consume reads e.Topic as group e.Group and calls e.Meter.Done for every
	// record once its work is finished, until ctx is cancelled (the meter
	// cancels it when the quota is reached); it then returns nil.
	Consume func(ctx context.Context, e *Env) error
}

// Slug is the scenario's name in lower case with dashes, used in group names,
// file names and flags.
func (s Scenario) Slug() string { return slug(s.Name) }

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

func slug(name string) string {
	return strings.Trim(nonWord.ReplaceAllString(strings.ToLower(name), "-"), "-")
}

// limit is the scenario's quota out of a topic of n records.
func (s Scenario) limit(n int) int {
	if s.Limit <= 0 || s.Limit > n {
		return n
	}
	return s.Limit
}

// ceiling says which client's ceiling a scenario is.
type ceiling int

const (
	notCeiling    ceiling = iota
	ceilingSarama         // raw sarama: the client idem is built on
	ceilingKgo            // raw franz-go: the fastest Go client
)

var registry []Scenario

func register(s Scenario) {
	for _, o := range registry {
		if o.Slug() == s.Slug() {
			panic("bench: scenario registered twice: " + s.Name)
		}
	}
	registry = append(registry, s)
}

// lookup finds a scenario by name or slug.
func lookup(name string) (Scenario, error) {
	for _, s := range registry {
		if s.Name == name || s.Slug() == slug(name) {
			return s, nil
		}
	}
	var names []string
	for _, s := range registry {
		names = append(names, fmt.Sprintf("%q", s.Slug()))
	}
	return Scenario{}, fmt.Errorf("unknown scenario %q (known: %s)", name, strings.Join(names, ", "))
}

// Env is what a scenario's Consume gets: where to read, how to report, and
// the shared clients of the child process.
type Env struct {
	Brokers []string
	Topic   string
	Group   string
	// Partitions is the number of partitions of the topics the harness
	// makes (-partitions): how many writers a NoKafka scenario runs, one per
	// partition worker of the consumer it stands beside.
	Partitions int
	// Pool is a pgx pool on DATABASE_URL (nil unless the scenario is PG), with
	// the inbox table migrated and the rows table (rowsTable) created.
	Pool  *pgxpool.Pool
	Meter *Meter

	// pending holds, in latency mode, the timestamps of records an idem
	// handler finished whose transaction has not committed yet (see Done).
	pending sync.Map // idempotency key → time.Time

	// phases records the batch phases of each record in the latency run of
	// a Breakdown scenario; nil otherwise.
	phases *phases
}

// Done is what an idem scenario's handler calls for each record it
// finished. Measuring throughput, the record is counted at once. Measuring
// latency, it is counted when the store's Process or ProcessBatch returns
// (the transaction committed, just before idem marks the offset), so the
// latency is record timestamp → committed, not → handler returned.
func (e *Env) Done(m *handler.Message) {
	if !e.Meter.latency {
		e.Meter.Done(m.Timestamp)
		return
	}
	e.pending.Store(m.IdempotencyKey, m.Timestamp)
}

// committed counts the records of keys whose transaction committed.
func (e *Env) committed(keys ...string) {
	for _, k := range keys {
		if ts, ok := e.pending.LoadAndDelete(k); ok {
			e.Meter.Done(ts.(time.Time))
		}
	}
}

// committing wraps an idem scenario's store so that, in latency mode,
// records are counted once their transaction commits.
type committing struct {
	e     *Env
	inner dedupe.Store
}

func (c committing) Process(ctx context.Context, rec dedupe.Record, fn func(context.Context) error) (dedupe.Outcome, error) {
	out, err := c.inner.Process(ctx, rec, fn)
	if err == nil {
		c.e.committed(rec.Key)
	}
	return out, err
}

// committingBatch is committing for a store that takes batches.
type committingBatch struct {
	committing
	batch dedupe.BatchStore
}

func (c committingBatch) ProcessBatch(ctx context.Context, recs []dedupe.Record, fn func(context.Context, []int) error) ([]dedupe.Outcome, error) {
	var b *batchTimes
	if c.e.phases != nil { // the batch's start, its handler's start and end, its COMMIT
		b, fn = c.e.phases.batch(fn)
	}
	outs, err := c.batch.ProcessBatch(ctx, recs, fn)
	if err == nil {
		if b != nil {
			c.e.phases.committed(b, recs)
		}
		for _, r := range recs {
			c.e.committed(r.Key)
		}
	}
	return outs, err
}

// wrap returns store counting records at commit in latency mode.
func (e *Env) wrap(store dedupe.Store) dedupe.Store {
	if !e.Meter.latency {
		return store
	}
	c := committing{e, store}
	if b, ok := store.(dedupe.BatchStore); ok {
		return committingBatch{c, b}
	}
	return c
}

// Sarama is the base sarama config every sarama-based scenario starts from,
// so they all fetch with the same settings: sarama's defaults, the broker
// version idem assumes, and the oldest offset for a new group.
func (e *Env) Sarama() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = wire.KafkaVersion
	c.ClientID = "idem-bench"
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Return.Errors = true
	if e.phases != nil { // when each record is fetched
		c.Consumer.Interceptors = []sarama.ConsumerInterceptor{e.phases}
	}
	return c
}

// Idem is the consumer.Config of the idem scenarios over store: defaults
// everywhere, logs discarded, metrics in a private registry (as a service
// that exports them would have).
func (e *Env) Idem(store dedupe.Store) consumer.Config {
	var keys consumer.KeyFunc // the default, HeaderKey(idemKeyHeader)
	if e.phases != nil {      // … noting when the worker takes each record
		keys = e.phases.keyFunc(consumer.HeaderKey(idemKeyHeader))
	}
	return consumer.Config{
		KeyFunc:    keys,
		Brokers:    e.Brokers,
		Group:      e.Group,
		Topics:     []string{e.Topic},
		Dedupe:     e.wrap(store),
		Sarama:     e.Sarama(),
		Logger:     slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(),
		// A benchmark run is short: the DLQ-depth watcher would only add
		// admin requests at start.
		DLQDepthInterval: -1,
		ShutdownGrace:    5 * time.Second,
	}
}

// idemKeyHeader is the header of each record's idempotency key (data.go
// writes it; idem's default KeyFunc reads it).
const idemKeyHeader = "idempotency-key"

// headerKey returns the last idemKeyHeader of m, as consumer.HeaderKey
// reads it ("" without one).
func headerKey(m *sarama.ConsumerMessage) string {
	for i := len(m.Headers) - 1; i >= 0; i-- {
		if h := m.Headers[i]; h != nil && string(h.Key) == idemKeyHeader {
			return string(h.Value)
		}
	}
	return ""
}

// rowsTable is the table the PG scenarios insert their "business" row into.
const rowsTable = "idem_bench_rows"

const rowsDDL = `CREATE TABLE IF NOT EXISTS ` + rowsTable + ` (
	consumer_group  text   NOT NULL,
	idempotency_key text   NOT NULL,
	"partition"     int    NOT NULL,
	"offset"        bigint NOT NULL,
	payload_len     int    NOT NULL
)`

const insertRow = `INSERT INTO ` + rowsTable +
	` (consumer_group, idempotency_key, "partition", "offset", payload_len) VALUES ($1, $2, $3, $4, $5)`

// insertRows is insertRow for a whole batch (arrays of keys, partitions,
// offsets and lengths).
const insertRows = `INSERT INTO ` + rowsTable +
	` (consumer_group, idempotency_key, "partition", "offset", payload_len)` +
	` SELECT $1, k, p, o, l FROM unnest($2::text[], $3::int[], $4::bigint[], $5::int[]) AS u(k, p, o, l)`

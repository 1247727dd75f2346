package index

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/coremetrics"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
)

// groupPrefix starts the consumer group the Indexer reads with by default.
const groupPrefix = "idem-console-indexer"

// defaultGroup is the consumer group the Indexer reads with by default:
// groupPrefix and a digest of the database's identity (the cluster's
// system identifier, or the server's address and port where that is not
// readable; the database; the schema the index's tables are in), so that
// indexers of different databases never share a group and split the DLQ
// partitions between them, while every replica of one console shares it.
func defaultGroup(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var cluster, db, schema string
	if err := pool.QueryRow(ctx, `SELECT coalesce(inet_server_addr()::text, 'local') || ':' || coalesce(inet_server_port(), 0)::text,
		current_database(), coalesce((SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = to_regclass('idem_dlq_records')), current_schema())`).
		Scan(&cluster, &db, &schema); err != nil {
		return "", fmt.Errorf("index: the database's identity (for the default group): %w", err)
	}
	var sysid string
	if err := pool.QueryRow(ctx, `SELECT system_identifier::text FROM pg_control_system()`).Scan(&sysid); err == nil {
		cluster = sysid
	}
	sum := sha256.Sum256([]byte(cluster + "\x00" + db + "\x00" + schema))
	return groupPrefix + "-" + hex.EncodeToString(sum[:6]), nil
}

// defaultTopicPattern matches idem's default dead-letter topic names
// (<topic>.<group>.dlq).
var defaultTopicPattern = regexp.MustCompile(`\.dlq$`)

// Indexer tails dead-letter topics with a consumer group of its own and stores
// each record in the index, once: it inserts by (topic, partition, offset)
// with ON CONFLICT DO NOTHING, and marks an offset for commit only after the
// transaction holding its record has committed. A crash at any point leads to
// redelivery, which the unique key turns into a no-op.
//
// The zero value is not usable: set Brokers and Pool.
type Indexer struct {
	// Brokers are the Kafka bootstrap brokers. Required.
	Brokers []string
	// Sarama is the client config (TLS, SASL, version); it is copied.
	// Consumer.Offsets.Initial is set to OffsetOldest (a new indexer indexes
	// what the topics retain), Consumer.IsolationLevel to ReadCommitted (the
	// records of aborted transactions are no dead letters), and
	// Consumer.Offsets.AutoCommit stays on: it commits only offsets marked
	// after their records were stored.
	// Default: sarama.NewConfig() with Version V4_0_0_0.
	Sarama *sarama.Config
	// Pool is the database holding the index. Run creates or upgrades the index's tables on it first (as idem.Migrate does).
	// Required.
	Pool *pgxpool.Pool
	// Topics are the dead-letter topics to index. When empty, every topic
	// matching TopicPattern is indexed, and the set is refreshed every
	// RefreshInterval.
	Topics []string
	// TopicPattern selects topics when Topics is empty.
	// Default: `\.dlq$` (names ending in ".dlq").
	TopicPattern *regexp.Regexp
	// RefreshInterval is how often topics matching TopicPattern are looked up,
	// and the DLQ topics' retention read for idem_dlq_retention_seconds.
	// Default: 30s.
	RefreshInterval time.Duration
	// Group is the consumer group the indexer reads with. Kafka: group.id.
	// Two indexers with one group split the topics' partitions between
	// them: give the replicas of one console the same group, and consoles
	// on different databases different ones.
	// Default: "idem-console-indexer-" followed by 12 hex digits of the
	// database's identity (its cluster, database and schema), so consoles
	// on different databases never share it.
	Group string
	// MaxValueBytes caps the copy of a record's value kept in the index; a
	// longer value is cut and flagged ValueTruncated (replay then reads the
	// record from Kafka while it is retained).
	// Default: 1 MiB.
	MaxValueBytes int
	// Retention is how long resolved, replayed and archived records are kept
	// after their last status change; Run sweeps them every hour. Negative
	// disables the sweep.
	// Default: 30 days.
	Retention time.Duration
	// EncryptionKeyFile names a file holding the key-encryption key (KEK)
	// of payload encryption at rest: 32 random bytes in base64 or
	// hexadecimal (`idem keys generate` writes one), one key a line; the
	// first wraps new data keys, the others only unwrap (during a rotation).
	// With a KEK, each record's value and headers are sealed with AES-256-GCM
	// under a data key (one per 30 days) that the KEK wraps and
	// idem_seal_keys keeps; the row carries the key's id, and card numbers
	// are taken out of the error and stack text kept in clear. Run refuses a
	// file that others may read, and a KEK that does not unwrap the index's
	// data keys (a wrong key file). Rows written before stay in clear and
	// read as ever.
	// Default: "" (payloads stored in clear).
	EncryptionKeyFile string
	// EncryptionKey is EncryptionKeyFile's content given directly, e.g. from
	// an environment variable (idem console reads IDEM_ENCRYPTION_KEY). Give
	// one of the two.
	// Default: "".
	EncryptionKey string
	// BatchSize bounds the records stored in one transaction.
	// Default: 500.
	BatchSize int
	// Logger receives the indexer's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the index's gauges:
	// idem_dlq_unresolved and idem_dlq_oldest_unresolved_seconds by group
	// and topic, read from the index at each scrape, and
	// idem_dlq_retention_seconds by topic (the DLQ topic's retention.ms,
	// read every RefreshInterval; absent when unlimited). It is the one registration a service
	// makes for them: a console (console.Config.Registerer) or another
	// Indexer given the same Registerer shares the same collector. Run
	// unregisters it when it returns, unless another registered it first.
	// Default: nil (no metrics).
	Registerer prometheus.Registerer

	// stored, when set (tests), is called after each batch's transaction
	// committed and before its offsets are marked.
	stored func(n int)

	keks   []seal.KEK   // EncryptionKeyFile's or EncryptionKey's, read by Run
	sealer *seal.Sealer // seals each batch (nil: encryption off), set by run
}

// Default values of the Indexer's fields.
const (
	defaultRefreshInterval = 30 * time.Second
	defaultMaxValueBytes   = 1 << 20
	defaultRetention       = 30 * 24 * time.Hour
	defaultBatchSize       = 500
)

// withDefaults returns a copy of ix with every default applied.
func (ix *Indexer) withDefaults() *Indexer {
	c := *ix
	if c.TopicPattern == nil {
		c.TopicPattern = defaultTopicPattern
	}
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = defaultRefreshInterval
	}
	if c.MaxValueBytes <= 0 {
		c.MaxValueBytes = defaultMaxValueBytes
	}
	if c.Retention == 0 {
		c.Retention = defaultRetention
	}
	if c.BatchSize <= 0 {
		c.BatchSize = defaultBatchSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return &c
}

// Validate reports the first field whose value Run cannot work with.
func (ix *Indexer) Validate() error {
	switch {
	case len(ix.Brokers) == 0:
		return errors.New("index: Indexer.Brokers is empty")
	case ix.Pool == nil:
		return errors.New("index: Indexer.Pool is nil")
	case ix.MaxValueBytes < 0:
		return fmt.Errorf("index: Indexer.MaxValueBytes = %d: must be >= 0 (0: 1 MiB)", ix.MaxValueBytes)
	case ix.BatchSize < 0:
		return fmt.Errorf("index: Indexer.BatchSize = %d: must be >= 0 (0: 500)", ix.BatchSize)
	case ix.Retention > 0 && ix.Retention < time.Hour:
		return fmt.Errorf("index: Indexer.Retention = %v: must be >= 1h (or negative to keep everything)", ix.Retention)
	case ix.EncryptionKeyFile != "" && ix.EncryptionKey != "":
		return errors.New("index: Indexer.EncryptionKeyFile and Indexer.EncryptionKey are both set: give the key-encryption key one way")
	}
	return nil
}

// Run indexes until ctx is done, then returns nil. It returns an error only
// for a configuration Validate rejects, a key-encryption key it cannot use
// (an unreadable or group-writable file, a key that does not unwrap the
// index's data keys), or when Registerer holds other
// collectors of the same metric names. Everything else is retried with
// backoff (1 s to 1 min) and logged: migrating its tables and the connection to Kafka at
// start (so a database or broker briefly down at start delays indexing but
// never ends it), and storing a batch.
func (ix *Indexer) Run(ctx context.Context) error {
	if err := ix.Validate(); err != nil {
		return err
	}
	c := ix.withDefaults()
	keks, err := seal.LoadKEKs(c.EncryptionKeyFile, c.EncryptionKey)
	if err != nil {
		return fmt.Errorf("index: encryption key: %w", err)
	}
	c.keks = keks
	backoff := time.Second
	for {
		err := c.run(ctx)
		switch {
		case err == nil || ctx.Err() != nil:
			return nil
		case errors.Is(err, errRegister):
			return err // a conflicting collector on the Registerer: retrying cannot help
		case errors.Is(err, seal.ErrWrongKEK):
			return err // the key file does not match the index's keys: retrying cannot help
		}
		c.Logger.Warn("index: indexer cannot start; retrying", "group", c.Group, "in", backoff, "err", err)
		if !pglead.Sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// errRegister wraps the error of a Registerer that refuses the index's
// collector: Run returns it, as retrying cannot help.
var errRegister = errors.New("index: register collectors")

// run is one life of the indexer: migrate, connect, consume until ctx is
// done. It returns an error when it cannot start.
func (c *Indexer) run(ctx context.Context) error {
	if err := tables.MigrateIndex(ctx, c.Pool); err != nil {
		return err
	}
	if c.keks != nil {
		if err := seal.Migrate(ctx, c.Pool); err != nil {
			return err
		}
		sl, err := seal.New(ctx, seal.Config{DB: c.Pool, KEKs: c.keks, Purpose: failidx.Purpose})
		if err != nil {
			return fmt.Errorf("index: encryption at rest: %w", err)
		}
		c.sealer = sl
		c.Logger.Info("index: payloads are encrypted at rest", "purpose", failidx.Purpose, "kek_id", c.keks[0].ID())
	}
	var cfg *sarama.Config
	if c.Sarama == nil {
		cfg = sarama.NewConfig()
		cfg.Version = sarama.V4_0_0_0
	} else {
		copied := *c.Sarama
		cfg = &copied
	}
	cfg.Metadata.AllowAutoTopicCreation = false
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Return.Errors = true
	// A dead-letter topic written with transactions holds the records of
	// aborted transactions: they are no dead letters.
	cfg.Consumer.IsolationLevel = sarama.ReadCommitted
	if c.Group == "" {
		g, err := defaultGroup(ctx, c.Pool)
		if err != nil {
			return err
		}
		c.Group = g
	}
	client, err := sarama.NewClient(c.Brokers, cfg)
	if err != nil {
		return fmt.Errorf("index: connect to %v: %w", c.Brokers, err)
	}
	defer client.Close()
	// Deferred in this order, they run: cancel, close the group (ending the
	// errors goroutine), wait for the goroutines, close the client.
	var wg sync.WaitGroup
	defer wg.Wait()
	group, err := sarama.NewConsumerGroupFromClient(c.Group, client)
	if err != nil {
		return fmt.Errorf("index: consumer group %s: %w", c.Group, err)
	}
	defer group.Close()

	store := failidx.NewStore(c.Pool)
	col := failidx.NewCollector(store)
	if c.Registerer != nil {
		var err error
		shared := coremetrics.Register(c.Registerer, col, &err)
		if err != nil {
			return fmt.Errorf("%w: %w", errRegister, err)
		}
		if shared == col {
			defer c.Registerer.Unregister(col)
		}
		col = shared
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Add(2)
	go func() {
		defer wg.Done()
		for err := range group.Errors() {
			c.Logger.Warn("index: consumer group error", "group", c.Group, "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		c.sweep(ctx, store)
	}()
	if len(c.Topics) > 0 {
		c.Logger.Info("index: indexing dead-letter topics", "group", c.Group, "topics", c.Topics)
	} else {
		c.Logger.Info("index: indexing dead-letter topics", "group", c.Group, "pattern", c.TopicPattern.String())
	}

	h := &claimHandler{ix: c}
	for ctx.Err() == nil {
		topics, err := c.topics(client)
		if err != nil {
			c.Logger.Warn("index: list dead-letter topics", "err", err)
		}
		c.readRetention(client, topics, col)
		c.syncAdmin(ctx, client, store, topics)
		if len(topics) == 0 {
			if !pglead.Sleep(ctx, c.RefreshInterval) {
				break
			}
			continue
		}
		// One consumer session until the topic set changes.
		sctx, stop := context.WithCancel(ctx)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer stop()
			for pglead.Sleep(sctx, c.RefreshInterval) {
				now, err := c.topics(client)
				if err == nil && !slices.Equal(now, topics) {
					c.Logger.Info("index: dead-letter topics changed", "topics", now)
					return
				}
				c.readRetention(client, now, col)
				c.syncAdmin(sctx, client, store, now)
			}
		}()
		for sctx.Err() == nil {
			if err := group.Consume(sctx, topics, h); err != nil {
				if errors.Is(err, sarama.ErrClosedConsumerGroup) {
					stop()
					return nil
				}
				c.Logger.Warn("index: consume", "group", c.Group, "err", err)
				pglead.Sleep(sctx, time.Second)
			}
		}
		stop()
	}
	return nil
}

// topics returns the sorted topics to index.
func (ix *Indexer) topics(client sarama.Client) ([]string, error) {
	if len(ix.Topics) > 0 {
		t := slices.Clone(ix.Topics)
		slices.Sort(t)
		return slices.Compact(t), nil
	}
	if err := client.RefreshMetadata(); err != nil {
		return nil, err
	}
	all, err := client.Topics()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range all {
		if ix.TopicPattern.MatchString(t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out, nil
}

// readRetention reads retention.ms of topics into col. Errors are logged:
// the metric is then absent.
func (ix *Indexer) readRetention(client sarama.Client, topics []string, col *failidx.Collector) {
	// The admin client refreshes the metadata of the topics the client
	// knows; with Metadata.Full off (idem's CLI) and named topics it may
	// know none yet. A topic that does not exist (yet) has no retention to
	// read: it is left out, without a warning (consume says it is missing).
	known := topics[:0:0]
	for _, t := range topics {
		if err := client.RefreshMetadata(t); err == nil {
			known = append(known, t)
		}
	}
	topics = known
	if len(topics) == 0 {
		return
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		ix.Logger.Warn("index: read retention.ms", "err", err)
		return
	}
	// Closing this admin would close the shared client: it is left to be
	// collected with it.
	ret := map[string]time.Duration{}
	resources := make([]*sarama.ConfigResource, len(topics))
	for i, t := range topics {
		resources[i] = &sarama.ConfigResource{Type: sarama.TopicResource, Name: t, ConfigNames: []string{"retention.ms"}}
	}
	results, err := admin.DescribeConfigs(resources, sarama.DescribeConfigsOptions{})
	if err != nil {
		ix.Logger.Warn("index: read retention.ms", "err", err)
		results = nil
	}
	for _, res := range results {
		if res.ErrorCode != sarama.ErrNoError {
			ix.Logger.Warn("index: read retention.ms", "topic", res.Name, "err", res.ErrorCode)
			continue
		}
		for _, e := range res.Configs {
			if e.Name == "retention.ms" {
				if ms, err := strconv.ParseInt(e.Value, 10, 64); err == nil && ms > 0 {
					ret[res.Name] = time.Duration(ms) * time.Millisecond
				}
			}
		}
	}
	col.SetRetention(ret)
}

// syncAdmin moves each topic's admin group ("<dlq>.admin") up to the first
// record the index has not settled (Store.SettledUpTo), so that
// idem_dlq_depth, which every consumer reports from that group, falls as
// records are replayed, resolved and archived in the console. It only ever
// moves the group forward. Errors are logged.
func (ix *Indexer) syncAdmin(ctx context.Context, client sarama.Client, s *failidx.Store, topics []string) {
	d := dlq.New(client)
	for _, t := range topics {
		parts, err := client.Partitions(t)
		if err != nil {
			continue // not created yet, or gone
		}
		at, err := s.SettledUpTo(ctx, t, parts)
		if err == nil && len(at) > 0 {
			err = d.Advance(ctx, t, at)
		}
		if err != nil && ctx.Err() == nil {
			ix.Logger.Warn("index: move the admin group past settled records", "topic", t, "err", err)
		}
	}
}

// sweep runs Store.Sweep every hour (the first time at once) until ctx is
// done, unless Retention is negative.
func (ix *Indexer) sweep(ctx context.Context, s *failidx.Store) {
	if ix.Retention < 0 {
		return
	}
	for {
		n, err := s.Sweep(ctx, ix.Retention)
		switch {
		case err != nil && ctx.Err() == nil:
			ix.Logger.Warn("index: sweep", "err", err)
		case n > 0:
			ix.Logger.Info("index: swept settled records", "deleted", n, "older_than", ix.Retention)
		}
		if !pglead.Sleep(ctx, time.Hour) {
			return
		}
	}
}

package index

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultGroup is the consumer group the Indexer reads with by default.
const DefaultGroup = "idem-console-indexer"

// DefaultTopicPattern matches idem's default dead-letter topic names
// (<topic>.<group>.dlq).
var DefaultTopicPattern = regexp.MustCompile(`\.dlq$`)

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
	// Default: sarama.NewConfig() with Version V4_0_0_0.
	Sarama *sarama.Config
	// Pool is the database holding the index (Migrate must have run; Run
	// runs it too). Required.
	Pool *pgxpool.Pool
	// Topics are the dead-letter topics to index. When empty, every topic
	// matching TopicPattern is indexed, and the set is refreshed every
	// RefreshInterval.
	Topics []string
	// TopicPattern selects topics when Topics is empty.
	// Default: DefaultTopicPattern (names ending in ".dlq").
	TopicPattern *regexp.Regexp
	// RefreshInterval is how often topics matching TopicPattern are looked up.
	// Default: 30s.
	RefreshInterval time.Duration
	// Group is the consumer group the indexer reads with. Kafka: group.id.
	// Default: DefaultGroup ("idem-console-indexer").
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
	// BatchSize bounds the records stored in one transaction.
	// Default: 500.
	BatchSize int
	// Logger receives the indexer's logs. Default: slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the index's collectors (see NewCollector):
	// idem_dlq_unresolved, idem_dlq_oldest_unresolved_seconds and
	// idem_dlq_retention_seconds.
	Registerer prometheus.Registerer
}

// Run indexes until ctx is done, then returns nil. It runs Migrate first. It
// returns an error for bad configuration or when the first connection to
// Kafka fails; later errors are logged and retried.
func (ix *Indexer) Run(ctx context.Context) error {
	return errors.New("index: not implemented")
}

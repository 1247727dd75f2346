package outboxstore

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/wire"
	"github.com/jackc/pgx/v5"
)

// Defaults of outbox.Relay's fields, applied by the relay when a field is
// zero, and the flag defaults of `idem outbox relay`.
const (
	Table        = "idem_outbox" // Relay.Table, and the table of outbox.Enqueue
	BatchSize    = 500           // Relay.BatchSize
	PollInterval = time.Second   // Relay.PollInterval
	LeaderRetry  = time.Second   // Relay.LeaderRetry
	MaxAttempts  = 10            // Relay.MaxAttempts
)

// ErrInvalidConfig is outbox.ErrInvalidConfig. It is declared here so that
// internal/outboxstore, which package outbox's own tests import, wraps the
// same sentinel without importing outbox.
var ErrInvalidConfig = errors.New("outbox: invalid configuration")

// Name is a parsed table name.
type Name struct {
	Schema string // "" when unqualified
	Rel    string // the table itself
	Quoted string // the SQL identifier, quoted ("schema"."table")
}

// Parse parses name, "table" or "schema.table" ("" for Table), each part
// non-empty, valid UTF-8 without NUL and at most 63 bytes (PostgreSQL's
// identifier length). Its errors wrap ErrInvalidConfig.
func Parse(name string) (Name, error) {
	if name == "" {
		name = Table
	}
	schema, rel, qualified := strings.Cut(name, ".")
	if !qualified {
		schema, rel = "", name
	}
	if rel == "" || (qualified && schema == "") {
		return Name{}, fmt.Errorf("%w: table name %q: want \"table\" or \"schema.table\" with non-empty parts", ErrInvalidConfig, name)
	}
	for _, p := range []string{schema, rel} {
		if len(p) > 63 || strings.ContainsRune(p, 0) || !utf8.ValidString(p) {
			return Name{}, fmt.Errorf("%w: table name %q: each part must be valid UTF-8, without NUL, at most 63 bytes", ErrInvalidConfig, name)
		}
	}
	return Name{Schema: schema, Rel: rel, Quoted: Qualify(schema, rel)}, nil
}

// Qualify quotes rel, in schema unless it is "".
func Qualify(schema, rel string) string {
	if schema == "" {
		return pgx.Identifier{rel}.Sanitize()
	}
	return pgx.Identifier{schema, rel}.Sanitize()
}

// HeaderID is the header the relay sets on every record it publishes to the
// row's event id (a UUID, stable across re-publishes of the row), so a
// consumer can recognise a copy; the relay also sets idempotency-key to it
// unless the message has one.
const HeaderID = "idem-outbox-id"

// ProducerConfig returns the sarama config the relay publishes with: a copy
// of base (nil: sarama.NewConfig()) with an idempotent acks=all producer,
// one in-flight request per connection, no topic auto-creation and the hash
// partitioner. The benchmark's raw producer uses it too, to compare like
// with like.
func ProducerConfig(base *sarama.Config) *sarama.Config {
	if base == nil {
		base = sarama.NewConfig()
	}
	c := *base
	if c.Version == sarama.DefaultVersion {
		c.Version = wire.KafkaVersion
	}
	c.Metadata.AllowAutoTopicCreation = false
	c.Producer.Idempotent = true
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Net.MaxOpenRequests = 1
	c.Producer.Return.Successes = true
	c.Producer.Return.Errors = true
	c.Producer.Partitioner = sarama.NewHashPartitioner
	c.Producer.Retry.Max = max(c.Producer.Retry.Max, 3)
	return &c
}

package tables

// The idem_deferred table, where package schedule
// keeps the records handlers deferred: its migrations (MigrateDeferred,
// which idem.Migrate and Scheduler.Run call), the insert the consumer makes
// when a handler defers a message (Defer, of a DeferredRecordOf), and the
// listing `idem schedule list` shows (ListDeferred). A service defers with handler.DeferUntil, runs the scheduler
// through consumer.Run, and has no need to list the records.

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/handler"
)

// DeferredTable is the table deferred records wait in, resolved through the
// connection's search_path (use a schema per service, or per test, to keep
// several apart).
const DeferredTable = "idem_deferred"

// deferredComponent is the pgmigrate component of the table.
const deferredComponent = "schedule"

// MigrateDeferred creates or upgrades the idem_deferred table, its index and the
// trigger that wakes the schedulers at commit (pgmigrate component
// "schedule"). It is idempotent and safe to call from several processes at
// once; idem.Migrate and schedule.Scheduler.Run call it.
func MigrateDeferred(ctx context.Context, db DB) error {
	if err := apply(ctx, db, deferredComponent, "deferred"); err != nil {
		return fmt.Errorf("schedule: migrate: %w", err)
	}
	return nil
}

// Querier is what List needs from a database handle: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Pending is one deferred record as List returns it.
type Pending struct {
	ID             int64
	Group          string
	Topic          string
	Partition      int32
	Key            []byte
	IdempotencyKey string
	Origin         handler.Origin // Timestamp is not stored: zero
	// DeferredUntil is the time the handler asked for; DueAt the next time
	// the scheduler tries to publish it (later than DeferredUntil after a
	// failed publish).
	DeferredUntil time.Time
	DueAt         time.Time
	CreatedAt     time.Time
	// Attempts counts failed publishes; LastError is the latest one's.
	Attempts  int
	LastError string
}

// DeferredFilter selects what List returns.
type DeferredFilter struct {
	// Group, when set, keeps only that consumer group's records.
	Group string
	// Limit caps the rows returned, in due order. Default: 100.
	Limit int
}

// ListDeferred returns pending deferred records in the order they come due (due_at,
// then id); what `idem schedule list` shows.
func ListDeferred(ctx context.Context, db Querier, f DeferredFilter) ([]Pending, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := db.Query(ctx, `SELECT id, consumer_group, topic, partition, key, idempotency_key, origin_topic,
		origin_partition, origin_offset, deferred_until, due_at, created_at, attempts, coalesce(last_error, '')
		FROM `+DeferredTable+` WHERE ($1 = '' OR consumer_group = $1) ORDER BY due_at, id LIMIT $2`, f.Group, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("schedule: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Pending, error) {
		var p Pending
		err := r.Scan(&p.ID, &p.Group, &p.Topic, &p.Partition, &p.Key, &p.IdempotencyKey, &p.Origin.Topic,
			&p.Origin.Partition, &p.Origin.Offset, &p.DeferredUntil, &p.DueAt, &p.CreatedAt, &p.Attempts, &p.LastError)
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("schedule: list: %w", err)
	}
	return out, nil
}

// Package schedulelist reads the deferred records that package schedule
// keeps in idem_deferred, for `idem schedule list`. A service defers with
// handler.DeferUntil and runs the scheduler through consumer.Run; it has no
// need to list them.
package schedulelist

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/handler"
)

// table is package schedule's table.
const table = "idem_deferred"

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

// Filter selects what List returns.
type Filter struct {
	// Group, when set, keeps only that consumer group's records.
	Group string
	// Limit caps the rows returned, in due order. Default: 100.
	Limit int
}

// List returns pending deferred records in the order they come due (due_at,
// then id); what `idem schedule list` shows.
func List(ctx context.Context, db Querier, f Filter) ([]Pending, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	rows, err := db.Query(ctx, `SELECT id, consumer_group, topic, partition, key, idempotency_key, origin_topic,
		origin_partition, origin_offset, deferred_until, due_at, created_at, attempts, coalesce(last_error, '')
		FROM `+table+` WHERE ($1 = '' OR consumer_group = $1) ORDER BY due_at, id LIMIT $2`, f.Group, f.Limit)
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

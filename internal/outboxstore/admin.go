package outboxstore

import (
	"context"
	"fmt"
	"time"

	"github.com/idemhq/idem/dedupe"
	"github.com/jackc/pgx/v5"
)

// Row states of the outbox table.
const (
	StatePending   = "pending"
	StatePublished = "published"
	StateFailed    = "failed"
)

// Row is an outbox row as List returns it.
type Row struct {
	ID          int64     // order of the row; what Retry takes
	EventID     string    // published as idem-outbox-id
	Topic       string    // destination topic
	Key         []byte    // Kafka key (nil for none)
	ValueSize   int       // bytes of the value
	CreatedAt   time.Time // insert time
	State       string    // StatePending, StatePublished or StateFailed
	Attempts    int       // failed publishes so far, outages included
	Rejections  int       // publishes Kafka rejected for the record itself; Relay.MaxAttempts of them fail the row
	LastError   string    // the last publish error ("" when none)
	RetryAt     time.Time // when a pending row that failed, or was enqueued with a NotBefore, is read again (zero when not waiting)
	NotBefore   time.Time // the message's NotBefore (zero when none)
	PublishedAt time.Time // zero unless State is StatePublished
}

// ListOptions selects the rows List returns.
type ListOptions struct {
	// Table is the outbox table, optionally "schema.table".
	// Default: "idem_outbox".
	Table string
	// State keeps only rows in that state ("" for every state).
	// Default: "".
	State string
	// Limit bounds the rows returned, lowest ids first.
	// Default: 100.
	Limit int
}

// List returns outbox rows in id order (values are not read; ValueSize gives
// their length). `idem outbox list` prints it.
func List(ctx context.Context, db dedupe.DB, opt ListOptions) ([]Row, error) {
	t, err := Parse(opt.Table)
	if err != nil {
		return nil, err
	}
	switch opt.State {
	case "", StatePending, StatePublished, StateFailed:
	default:
		return nil, fmt.Errorf("%w: ListOptions.State = %q: want pending, published, failed or empty", ErrInvalidConfig, opt.State)
	}
	if opt.Limit <= 0 {
		opt.Limit = 100
	}
	q, ok := db.(interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	})
	if !ok {
		return nil, fmt.Errorf("%w: List needs a DB with Query (a *pgxpool.Pool, *pgx.Conn or pgx.Tx)", ErrInvalidConfig)
	}
	rows, err := q.Query(ctx, `SELECT id, event_id::text, topic, key, coalesce(length(value), 0), created_at, state,
		attempts, rejections, coalesce(last_error, ''), retry_at, published_at, not_before
		FROM `+t.Quoted+` WHERE ($1 = '' OR state = $1) ORDER BY id LIMIT $2`, opt.State, opt.Limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list %s: %w", t.Quoted, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var x Row
		var retryAt, publishedAt, notBefore *time.Time
		err := r.Scan(&x.ID, &x.EventID, &x.Topic, &x.Key, &x.ValueSize, &x.CreatedAt, &x.State,
			&x.Attempts, &x.Rejections, &x.LastError, &retryAt, &publishedAt, &notBefore)
		if notBefore != nil {
			x.NotBefore = *notBefore
		}
		if retryAt != nil && x.State == StatePending {
			x.RetryAt = *retryAt
		}
		if publishedAt != nil {
			x.PublishedAt = *publishedAt
		}
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list %s: %w", t.Quoted, err)
	}
	return out, nil
}

// Retry makes the failed rows ids of table ("" for idem_outbox) pending
// again, with their attempts and rejections reset, and wakes the relay. It returns the ids
// it changed; ids that are not failed (unknown, pending, published) are left
// alone and not returned. The last error is kept until the next publish.
func Retry(ctx context.Context, db dedupe.DB, table string, ids ...int64) ([]int64, error) {
	t, err := Parse(table)
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, nil
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("outbox: retry: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, `UPDATE `+t.Quoted+` SET state = 'pending', attempts = 0, rejections = 0, retry_at = NULL
		WHERE id = ANY($1) AND state = 'failed' RETURNING id`, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: retry: %w", err)
	}
	done, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("outbox: retry: %w", err)
	}
	if len(done) > 0 {
		if _, err := tx.Exec(ctx, "SELECT pg_notify('idem_outbox_' || $1::regclass::oid::text, '')", t.Quoted); err != nil {
			return nil, fmt.Errorf("outbox: retry: notify relay: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("outbox: retry: %w", err)
	}
	return done, nil
}

// Package steptable is the idem_steps table of package step: its
// migrations (Migrate, which idem.Migrate runs) and the statements on it
// (Get, Record, Sweep). Package step is the public side; nothing else
// reads the table.
package steptable

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migrate creates or upgrades the idem_steps table (pgmigrate component
// "step"); idem.Migrate runs it. It is idempotent and safe to call from
// several processes at once.
func Migrate(ctx context.Context, db dedupe.DB) error {
	if err := pgmigrate.LoadApply(ctx, db, "step", migrationFS, nil); err != nil {
		return fmt.Errorf("step: migrate: %w", err)
	}
	return nil
}

// Row is one recorded step: Done with its Result (JSON), or failed with
// Error.
type Row struct {
	Done   bool
	Result json.RawMessage
	Error  string
}

// ID names a step: the message's group and idempotency key, and the step's
// name.
type ID struct {
	Group, Key, Step string
}

// Get returns the recorded row of id, and false when there is none.
func Get(ctx context.Context, db dedupe.DB, id ID) (Row, bool, error) {
	var status string
	var row Row
	err := db.QueryRow(ctx, `SELECT status, result, error FROM idem_steps
		WHERE consumer_group = $1 AND idempotency_key = $2 AND step = $3`,
		id.Group, id.Key, id.Step).Scan(&status, &row.Result, &row.Error)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, err
	}
	row.Done = status == "done"
	return row, true, nil
}

// Record inserts row for id unless one is recorded already, in a statement
// of its own (committed when it returns), and returns the row that holds:
// row, or the one another call recorded first.
func Record(ctx context.Context, db dedupe.DB, id ID, row Row) (Row, error) {
	status, result := "failed", []byte(nil)
	if row.Done {
		status, result = "done", row.Result
	}
	tag, err := db.Exec(ctx, `INSERT INTO idem_steps (consumer_group, idempotency_key, step, status, result, error)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer_group, idempotency_key, step) DO NOTHING`,
		id.Group, id.Key, id.Step, status, result, row.Error)
	if err != nil {
		return Row{}, err
	}
	if tag.RowsAffected() == 1 {
		return row, nil
	}
	got, ok, err := Get(ctx, db, id)
	if err == nil && !ok {
		err = fmt.Errorf("step %q: recorded by another call, then gone (swept?)", id.Step)
	}
	return got, err
}

// Sweep deletes the rows recorded before horizon, batch rows per statement,
// and returns how many it deleted.
func Sweep(ctx context.Context, db dedupe.DB, horizon time.Time, batch int) (int64, error) {
	// ctid = ANY(ARRAY(subquery)) is the batched DELETE dedupe's sweeper uses.
	const q = `DELETE FROM idem_steps WHERE ctid = ANY(ARRAY(SELECT ctid FROM idem_steps
		WHERE recorded_at < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))`
	var deleted int64
	for {
		tag, err := db.Exec(ctx, q, horizon, batch)
		if err != nil {
			return deleted, fmt.Errorf("step: sweep idem_steps: %w", err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return deleted, nil
		}
	}
}

// SweepOlder deletes the rows recorded more than olderThan ago (by the
// database's clock), batch rows per statement, and returns how many it
// deleted.
func SweepOlder(ctx context.Context, db dedupe.DB, olderThan time.Duration, batch int) (int64, error) {
	var horizon time.Time
	if err := db.QueryRow(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", olderThan.Microseconds()).Scan(&horizon); err != nil {
		return 0, fmt.Errorf("step: sweep idem_steps: read horizon: %w", err)
	}
	return Sweep(ctx, db, horizon, batch)
}

// Scope is what package step needs from a handler's ctx: where steps are
// recorded (the dedupe store's database), whose they are (the consumer
// group) and the message being handled (its idempotency key; "" in a batch
// handler, whose step names its message with step.For). consumer.Run puts
// one per worker into the handler's ctx (WithScope) and sets Key before
// each handler call, so a call allocates nothing.
type Scope struct {
	DB    dedupe.DB // nil: the dedupe store has no database (dedupe.NewMemory)
	Group string
	Key   string
}

type scopeKey struct{}

// WithScope returns ctx carrying sc.
func WithScope(ctx context.Context, sc *Scope) context.Context {
	return context.WithValue(ctx, scopeKey{}, sc)
}

// ScopeOf returns the scope ctx carries, or nil.
func ScopeOf(ctx context.Context) *Scope {
	sc, _ := ctx.Value(scopeKey{}).(*Scope)
	return sc
}

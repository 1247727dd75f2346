package tables

// The idem_steps table of package step: its
// migrations (MigrateSteps, which idem.Migrate runs) and the statements on
// it (GetStep, RecordStep, SweepSteps). Package step is the public side; nothing else
// reads the table.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// MigrateSteps creates or upgrades the idem_steps table (pgmigrate component
// "step"); idem.Migrate runs it. It is idempotent and safe to call from
// several processes at once.
func MigrateSteps(ctx context.Context, db DB) error {
	if err := apply(ctx, db, "step", "steps"); err != nil {
		return fmt.Errorf("step: migrate: %w", err)
	}
	return nil
}

// StepRow is one recorded step: Done with its Result (JSON), or failed with
// Error.
type StepRow struct {
	Done   bool
	Result json.RawMessage
	Error  string
}

// StepID names a step: the message's group and idempotency key, and the step's
// name.
type StepID struct {
	Group, Key, Step string
}

// GetStep returns the recorded row of id, and false when there is none.
func GetStep(ctx context.Context, db DB, id StepID) (StepRow, bool, error) {
	var status string
	var row StepRow
	err := db.QueryRow(ctx, `SELECT status, result, error FROM idem_steps
		WHERE consumer_group = $1 AND idempotency_key = $2 AND step = $3`,
		id.Group, id.Key, id.Step).Scan(&status, &row.Result, &row.Error)
	if errors.Is(err, pgx.ErrNoRows) {
		return StepRow{}, false, nil
	}
	if err != nil {
		return StepRow{}, false, err
	}
	row.Done = status == "done"
	return row, true, nil
}

// RecordStep inserts row for id unless one is recorded already, in a statement
// of its own (committed when it returns), and returns the row that holds:
// row, or the one another call recorded first.
func RecordStep(ctx context.Context, db DB, id StepID, row StepRow) (StepRow, error) {
	status, result := "failed", []byte(nil)
	if row.Done {
		status, result = "done", row.Result
	}
	tag, err := db.Exec(ctx, `INSERT INTO idem_steps (consumer_group, idempotency_key, step, status, result, error)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer_group, idempotency_key, step) DO NOTHING`,
		id.Group, id.Key, id.Step, status, result, row.Error)
	if err != nil {
		return StepRow{}, err
	}
	if tag.RowsAffected() == 1 {
		return row, nil
	}
	got, ok, err := GetStep(ctx, db, id)
	if err == nil && !ok {
		err = fmt.Errorf("step %q: recorded by another call, then gone (swept?)", id.Step)
	}
	return got, err
}

// SweepSteps deletes the rows recorded before horizon, batch rows per statement,
// and returns how many it deleted.
func SweepSteps(ctx context.Context, db DB, horizon time.Time, batch int) (int64, error) {
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

// SweepStepsOlder deletes the rows recorded more than olderThan ago (by the
// database's clock), batch rows per statement, and returns how many it
// deleted.
func SweepStepsOlder(ctx context.Context, db DB, olderThan time.Duration, batch int) (int64, error) {
	var horizon time.Time
	if err := db.QueryRow(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", olderThan.Microseconds()).Scan(&horizon); err != nil {
		return 0, fmt.Errorf("step: sweep idem_steps: read horizon: %w", err)
	}
	return SweepSteps(ctx, db, horizon, batch)
}

// StepScope is what package step needs from a handler's ctx: where steps are
// recorded (the dedupe store's database), whose they are (the consumer
// group) and the message being handled (its idempotency key; "" in a batch
// handler, whose step names its message with step.For). consumer.Run puts
// one per worker into the handler's ctx (WithScope) and sets Key before
// each handler call, so a call allocates nothing.
type StepScope struct {
	DB    DB // nil: the dedupe store has no database (dedupe.NewMemory)
	Group string
	Key   string
}

type scopeKey struct{}

// WithStepScope returns ctx carrying sc.
func WithStepScope(ctx context.Context, sc *StepScope) context.Context {
	return context.WithValue(ctx, scopeKey{}, sc)
}

// StepScopeOf returns the scope ctx carries, or nil.
func StepScopeOf(ctx context.Context) *StepScope {
	sc, _ := ctx.Value(scopeKey{}).(*StepScope)
	return sc
}

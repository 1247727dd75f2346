package tables

// The idem_checkpoint table, one row per batch job
// of package checkpoint: its migrations (MigrateCheckpoint, which
// idem.Migrate runs), the row (Checkpoint), reading it (GetCheckpoint,
// ListCheckpoints), moving it (ResetCheckpoint) and the job's advisory lock
// (CheckpointLockKey), which the runner and ResetCheckpoint share.
// `idem checkpoint status` and `idem checkpoint reset` use it; a service
// creates the table with idem.Migrate and runs its jobs with package
// checkpoint.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// MigrateCheckpoint creates or upgrades the idem_checkpoint table (pgmigrate component
// "checkpoint"); idem.Migrate runs it. It is idempotent and safe to call
// from several processes at once.
func MigrateCheckpoint(ctx context.Context, db DB) error {
	if err := apply(ctx, db, "checkpoint", "checkpoint"); err != nil {
		return fmt.Errorf("checkpoint: migrate: %w", err)
	}
	return nil
}

// ErrNoCheckpoint is returned by Get and Reset for a job with no checkpoint row.
var ErrNoCheckpoint = errors.New("checkpoint: no such job")

// CheckpointLockKey is the pg_advisory_xact_lock key of job: the FNV-1a 64-bit hash of
// "idem-checkpoint:" + job. checkpoint.Runner.Run and Reset hold it for each
// transaction.
func CheckpointLockKey(job string) int64 {
	h := fnv.New64a()
	h.Write([]byte("idem-checkpoint:" + job))
	return int64(h.Sum64())
}

// Checkpoint is a job's checkpoint row.
type Checkpoint struct {
	Job        string    `json:"job"`
	Cursor     string    `json:"cursor"`               // key of the last row of the last committed chunk; "" = start
	Rows       int64     `json:"rows"`                 // rows processed since the row was created or reset
	Chunks     int64     `json:"chunks"`               // chunks committed since then
	CreatedAt  time.Time `json:"created_at"`           // first run
	UpdatedAt  time.Time `json:"updated_at"`           // last commit
	FinishedAt time.Time `json:"finished_at,omitzero"` // when a run last found no rows left; zero while unfinished
}

const selectCheckpoint = `SELECT job, cursor, rows_done, chunks_done, created_at, updated_at,
	finished_at FROM idem_checkpoint`

func scanCheckpoint(row pgx.Row) (Checkpoint, error) {
	var s Checkpoint
	var fin *time.Time
	err := row.Scan(&s.Job, &s.Cursor, &s.Rows, &s.Chunks, &s.CreatedAt, &s.UpdatedAt, &fin)
	if fin != nil {
		s.FinishedAt = *fin
	}
	return s, err
}

// GetCheckpoint returns job's checkpoint, or ErrNotFound.
func GetCheckpoint(ctx context.Context, db DB, job string) (Checkpoint, error) {
	s, err := scanCheckpoint(db.QueryRow(ctx, selectCheckpoint+" WHERE job = $1", job))
	if errors.Is(err, pgx.ErrNoRows) {
		return Checkpoint{}, fmt.Errorf("%w: %q", ErrNoCheckpoint, job)
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint: get %s: %w", job, err)
	}
	return s, nil
}

// ListCheckpoints returns every job's checkpoint, ordered by job name.
func ListCheckpoints(ctx context.Context, db DB) ([]Checkpoint, error) {
	tx, err := db.Begin(ctx) // a read-only use of a transaction: DB has no Query
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	rows, err := tx.Query(ctx, selectCheckpoint+" ORDER BY job")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Checkpoint, error) { return scanCheckpoint(r) })
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list: %w", err)
	}
	return out, nil
}

// ResetCheckpoint moves job's checkpoint to cursor ("" = the start, so the next Run
// processes every row again) and zeroes its counts. It takes the job's
// advisory lock, so it waits for a chunk in progress and never lands in the
// middle of one. It returns ErrNotFound for a job with no checkpoint row.
// Rows already processed are not undone: resetting re-runs Process on them.
func ResetCheckpoint(ctx context.Context, db DB, job, cursor string) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("checkpoint: reset %s: begin: %w", job, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", CheckpointLockKey(job)); err != nil {
		return fmt.Errorf("checkpoint: reset %s: advisory lock: %w", job, err)
	}
	tag, err := tx.Exec(ctx, `UPDATE idem_checkpoint SET cursor = $2, rows_done = 0, chunks_done = 0,
		updated_at = now(), finished_at = NULL WHERE job = $1`, job, cursor)
	if err != nil {
		return fmt.Errorf("checkpoint: reset %s: %w", job, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: %q", ErrNoCheckpoint, job)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("checkpoint: reset %s: commit: %w", job, err)
	}
	return nil
}

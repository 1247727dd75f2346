package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/tables"
)

// defaultChunkSize is Job.ChunkSize when zero.
const defaultChunkSize = 500

// rollbackTimeout bounds a rollback run after the caller's ctx is done.
const rollbackTimeout = 5 * time.Second

// Errors.
var (
	// errInvalidJob prefixes every problem NewRunner reports; each names the field.
	errInvalidJob = errors.New("checkpoint: invalid job")
	// errNoProgress is wrapped by Run's error when Read returns rows but the
	// same cursor it was given, which would process one chunk for ever: a
	// bug in Read, which the error names.
	errNoProgress = errors.New("checkpoint: Read returned rows without advancing the cursor")
)

// Job describes a batch job over rows of type R.
type Job[R any] struct {
	// Name identifies the job's checkpoint row and is the job label of the
	// metrics. Required; keep it stable across releases, or the job restarts
	// from the beginning.
	Name string

	// ChunkSize is the most rows read, processed and committed together.
	// Bigger chunks commit less often; a crash redoes at most one chunk.
	// Default: 500.
	ChunkSize int

	// Read returns up to limit rows strictly after the cursor after, in key
	// order, and the cursor of the last row returned. after is "" on the first
	// chunk (no checkpoint yet, or after a reset to ""): read from the start.
	// Cursors are text so that any key fits (strconv.FormatInt of an id, an
	// RFC 3339 timestamp plus an id, …); the runner stores them and never
	// compares them. Read runs in the chunk's transaction. It must return
	// rows in the same order each time and a last cursor that moves forward
	// (Run fails, naming the cursor, when rows come with the cursor it was
	// given); no rows means the job is done. It must also never return a row whose
	// cursor is past a row that may still appear: "WHERE id > cursor" meets
	// that only for a table nothing inserts into while the job runs (ids
	// are drawn at INSERT, and a transaction holding a lower id may commit
	// later). For a live table use LiveTable's Read. Required.
	Read func(ctx context.Context, tx pgx.Tx, after string, limit int) (rows []R, last string, err error)

	// Process does the chunk's work through tx; its writes commit with the
	// checkpoint, or roll back with it. An error rolls the chunk back, and
	// Run returns it (wrapped) with the checkpoint unchanged. Required.
	Process func(ctx context.Context, tx pgx.Tx, rows []R) error

	// Registerer receives the idem_checkpoint_* metrics (see package
	// metrics). Default: nil, metrics are kept but not exported.
	Registerer prometheus.Registerer
}

// withDefaults returns job with every zero field set to its default: the one
// place Job's defaults live.
func (job Job[R]) withDefaults() Job[R] {
	if job.ChunkSize == 0 {
		job.ChunkSize = defaultChunkSize
	}
	return job
}

// Runner runs a Job. It is safe for concurrent use: several Runs (in one
// process or many) of one job take turns chunk by chunk.
type Runner[R any] struct {
	job  Job[R]
	lock int64
	m    *collectors
}

// NewRunner validates job, fills its defaults and registers its metrics. It
// reports every bad field of job at once (errors.Join), each naming the
// field, its value and the rule ("checkpoint: invalid job: Job.Name = "":
// …"); a bad Job is the only error it returns.
func NewRunner[R any](job Job[R]) (*Runner[R], error) {
	l := configerr.New(errInvalidJob, "Job.")
	if job.Name == "" {
		l.Bad("Name", job.Name, "required")
	}
	if job.ChunkSize < 0 {
		l.Bad("ChunkSize", job.ChunkSize, fmt.Sprintf("must be >= 0 (0: %d)", defaultChunkSize))
	}
	if job.Read == nil {
		l.Bad("Read", nil, "required")
	}
	if job.Process == nil {
		l.Bad("Process", nil, "required")
	}
	if err := l.Err(); err != nil {
		return nil, err
	}
	job = job.withDefaults()
	m, err := newCollectors(job.Registerer)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: metrics: %w", err)
	}
	return &Runner[R]{job: job, lock: tables.CheckpointLockKey(job.Name), m: m}, nil
}

// Stats counts what one Run did.
type Stats struct {
	Rows   int64 // rows processed in committed chunks
	Chunks int64 // chunks committed
}

// Run processes chunks until Read returns no rows (the job is done; its
// finished_at is set), ctx is done, or a chunk fails. Each chunk is one
// transaction on db, holding the job's advisory lock. On error the failed
// chunk is rolled back and the checkpoint stays after the last committed
// chunk, so calling Run again resumes there. The error wraps the cause and
// names the job and cursor.
func (r *Runner[R]) Run(ctx context.Context, db dedupe.DB) (Stats, error) {
	var st Stats
	for {
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("checkpoint: job %s: %w", r.job.Name, err)
		}
		n, done, err := r.chunk(ctx, db)
		if err != nil {
			r.m.Chunks.WithLabelValues(r.job.Name, "failed").Inc()
			return st, err
		}
		if done {
			return st, nil
		}
		st.Rows += int64(n)
		st.Chunks++
	}
}

// chunk runs one chunk transaction; done reports that no rows were left.
func (r *Runner[R]) chunk(ctx context.Context, db dedupe.DB) (n int, done bool, err error) {
	start := time.Now()
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: begin: %w", r.job.Name, err)
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_ = tx.Rollback(rctx)
			cancel()
		}
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", r.lock); err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: advisory lock: %w", r.job.Name, err)
	}
	r.m.LockWait.WithLabelValues(r.job.Name).Observe(time.Since(start).Seconds())
	if _, err := tx.Exec(ctx, "INSERT INTO idem_checkpoint (job) VALUES ($1) ON CONFLICT DO NOTHING", r.job.Name); err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: create checkpoint: %w", r.job.Name, err)
	}
	var cursor string
	if err := tx.QueryRow(ctx, "SELECT cursor FROM idem_checkpoint WHERE job = $1 FOR UPDATE", r.job.Name).Scan(&cursor); err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: read checkpoint: %w", r.job.Name, err)
	}
	rows, last, err := r.job.Read(ctx, tx, cursor, r.job.ChunkSize)
	if err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: read after %q: %w", r.job.Name, cursor, err)
	}
	if len(rows) == 0 {
		if _, err := tx.Exec(ctx, "UPDATE idem_checkpoint SET finished_at = now(), updated_at = now() WHERE job = $1", r.job.Name); err != nil {
			return 0, false, fmt.Errorf("checkpoint: job %s: mark finished: %w", r.job.Name, err)
		}
		if err := tx.Commit(ctx); err != nil {
			return 0, false, fmt.Errorf("checkpoint: job %s: commit: %w", r.job.Name, err)
		}
		return 0, true, nil
	}
	if last == cursor {
		return 0, false, fmt.Errorf("checkpoint: job %s: %w (cursor %q, %d rows)", r.job.Name, errNoProgress, cursor, len(rows))
	}
	if err := r.job.Process(ctx, tx, rows); err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: process %d rows after %q: %w", r.job.Name, len(rows), cursor, err)
	}
	if _, err := tx.Exec(ctx, `UPDATE idem_checkpoint SET cursor = $2, rows_done = rows_done + $3,
		chunks_done = chunks_done + 1, updated_at = now(), finished_at = NULL WHERE job = $1`,
		r.job.Name, last, len(rows)); err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: advance checkpoint: %w", r.job.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, fmt.Errorf("checkpoint: job %s: commit chunk after %q: %w", r.job.Name, cursor, err)
	}
	r.m.Rows.WithLabelValues(r.job.Name).Add(float64(len(rows)))
	r.m.Chunks.WithLabelValues(r.job.Name, "committed").Inc()
	r.m.ChunkDuration.WithLabelValues(r.job.Name).Observe(time.Since(start).Seconds())
	return len(rows), false, nil
}

// ChunkSize returns the chunk size in use (Job.ChunkSize or its default).
func (r *Runner[R]) ChunkSize() int { return r.job.ChunkSize }

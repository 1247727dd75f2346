package failidx

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Actions that publish (a replay, an edit and retry) happen once, whoever
// clicks twice, whichever second operator or CLI acts beside them, and
// whenever a process dies:
//
//  1. Claim. One transaction creates a job (idem_dlq_jobs) and moves the
//     records to 'replaying' under it in the statement that selects them
//     (UPDATE … SET status = 'replaying' WHERE status = 'unresolved'
//     RETURNING id). A record another action claimed first is not selected.
//  2. Act. The job's holder publishes the claimed records one by one. Before
//     each send it stores where the record goes and that partition's end
//     offset (publish_topic, publish_partition, publish_from).
//  3. Record. After the broker acknowledged it, the record becomes
//     'replayed' and the job counts it. At the end, the job's outcome is
//     written to the audit log.
//
// A job belongs to the process that runs it (owner, refreshed by a
// heartbeat). A process that stops hands its jobs back (owner NULL); one that
// dies leaves a heartbeat that ages. Either way ResumeJobs in another
// process takes the job over, and for a record whose send had started it
// first reads the destination partition from publish_from: a record there
// whose idem-replay-of names the dead letter means the send happened, and
// the record is marked replayed without a second send.

// JobState is the state of a Job.
type JobState string

// The states of a Job.
const (
	// JobRunning: claimed records are being published (or wait for a
	// process to resume the job).
	JobRunning JobState = "running"
	// JobDone: every claimed record was dealt with.
	JobDone JobState = "done"
	// JobCancelled: cancelled; the records not published went back to
	// unresolved.
	JobCancelled JobState = "cancelled"
	// JobFailed: publishing failed (Kafka refused a send); the records not
	// published went back to unresolved.
	JobFailed JobState = "failed"
)

// Job is one replay or edit-and-retry: the records it claimed and how far
// it got.
type Job struct {
	ID int64
	// Action is "replay" or "edit-retry".
	Action string
	// Actor, Reason and Detail are as the audit row will say; To is the
	// replay's destination ("" for each record's origin topic); Rate the
	// records per second (0: no cap).
	Actor, Reason, Detail, To string
	Rate                      int
	// RecordIDs are the records the action selected.
	RecordIDs []int64
	State     JobState
	// Matched counts the records selected, Claimed those the job took
	// (unresolved, not stubs), Done those published, Skipped the rest
	// (stubs, records not unresolved, records that failed: see Errors).
	Matched, Claimed, Done, Skipped int
	SkippedStubs                    []int64
	Errors                          []string
	// CancelRequested says someone asked to cancel it (CancelledBy).
	CancelRequested bool
	CancelledBy     string
	// Owner is the process running it ("" when none); HeartbeatAt when it
	// last said so.
	Owner       string
	HeartbeatAt time.Time
	CreatedAt   time.Time
	FinishedAt  time.Time
}

// Result is the job's outcome as a Result.
func (j Job) Result() Result {
	return Result{Matched: j.Matched, Done: j.Done, Skipped: j.Skipped, SkippedStubs: j.SkippedStubs, Errors: j.Errors}
}

// Finished reports whether the job has ended (done, cancelled or failed).
func (j Job) Finished() bool { return j.State != JobRunning }

const jobCols = `id, action, actor, reason, detail, to_topic, rate, record_ids, state, matched, claimed, done, skipped,
	skipped_stubs, errors, cancel_requested, cancelled_by, coalesce(owner, ''), heartbeat_at, created_at, finished_at`

func scanJob(row pgx.Row) (Job, error) {
	var j Job
	var state string
	var beat, finished *time.Time
	err := row.Scan(&j.ID, &j.Action, &j.Actor, &j.Reason, &j.Detail, &j.To, &j.Rate, &j.RecordIDs, &state, &j.Matched,
		&j.Claimed, &j.Done, &j.Skipped, &j.SkippedStubs, &j.Errors, &j.CancelRequested, &j.CancelledBy, &j.Owner, &beat,
		&j.CreatedAt, &finished)
	j.State = JobState(state)
	if beat != nil {
		j.HeartbeatAt = *beat
	}
	if finished != nil {
		j.FinishedAt = *finished
	}
	return j, err
}

// Job returns job id; an error wrapping ErrNotFound when there is none.
func (s *Store) Job(ctx context.Context, id int64) (Job, error) {
	j, err := scanJob(s.db.QueryRow(ctx, `SELECT `+jobCols+` FROM idem_dlq_jobs WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return j, fmt.Errorf("%w: job %d", ErrNotFound, id)
	}
	if err != nil {
		return j, fmt.Errorf("index: job %d: %w", id, err)
	}
	return j, nil
}

// Jobs returns up to limit jobs, newest first, starting after cursor (a
// job id; "" for the first page), and the next page's cursor ("" on the
// last page). limit <= 0 means 50; it is capped at 1000.
func (s *Store) Jobs(ctx context.Context, cursor string, limit int) ([]Job, string, error) {
	limit, before, err := pageArgs(cursor, limit)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx, `SELECT `+jobCols+` FROM idem_dlq_jobs WHERE id < $1 ORDER BY id DESC LIMIT $2`, before, limit+1)
	if err != nil {
		return nil, "", fmt.Errorf("index: jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Job, error) { return scanJob(row) })
	if err != nil {
		return nil, "", fmt.Errorf("index: jobs: %w", err)
	}
	out, next := nextPage(out, limit, func(j Job) int64 { return j.ID })
	return out, next, nil
}

// newOwner names one Actions as the holder of the jobs it runs.
func newOwner() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

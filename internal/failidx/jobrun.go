package failidx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/committed"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/wire"
)

// Defaults of the jobs' timing.
const (
	// defaultLease is how long a job's heartbeat may age before another
	// process takes the job over.
	defaultLease = 30 * time.Second
	// heartbeatEvery is how often a running job refreshes its heartbeat and
	// looks for a cancel request.
	heartbeatEvery = time.Second
	// doubtWait bounds the wait of the read that settles a record whose send
	// may have happened.
	doubtWait = 10 * time.Second
)

// errLostJob is returned by RunJob when another process took the job over
// (this one's heartbeat aged past the lease).
var errLostJob = errors.New("index: another process took the job over")

// claimed is a record a job holds: what the publish needs.
type claimed struct {
	Record
	publishTopic     string
	publishPartition int32
	publishFrom      int64
	inDoubt          bool // a send started: publish_from is set
}

// RunJob publishes the records job id holds and returns the job as it
// ended. a must hold the job (StartReplay, StartEdit or ResumeJobs gave it
// to a). When ctx ends first, the job is handed back unfinished (owner
// cleared) for ResumeJobs elsewhere, and RunJob returns ctx's error. A
// cancel request (CancelJob) is seen within a second: the records not yet
// published go back to unresolved. A send Kafka refuses fails the job the
// same way, and RunJob returns the job and an error. Records that cannot be
// built (a truncated value that expired from Kafka) go back to unresolved
// and are named in Job.Errors.
func (a *Actions) RunJob(ctx context.Context, id int64) (Job, error) {
	j, err := a.store.Job(ctx, id)
	if err != nil {
		return j, err
	}
	if j.Finished() {
		return j, nil
	}
	var pub *publisher
	if a.client == nil {
		return a.finish(ctx, j, JobFailed, errNoClient)
	}
	if pub, err = newPublisher(a.client); err != nil {
		return a.finish(ctx, j, JobFailed, err)
	}
	defer pub.close()
	var interval time.Duration
	if j.Rate > 0 {
		interval = time.Second / time.Duration(j.Rate)
	}
	var next, beat time.Time
	for {
		recs, err := a.claimedRecords(ctx, j.ID)
		if err != nil {
			return a.stop(ctx, j, err)
		}
		if len(recs) == 0 {
			return a.finish(ctx, j, JobDone, nil)
		}
		for _, r := range recs {
			if time.Since(beat) >= heartbeatEvery {
				cancel, err := a.heartbeat(ctx, j.ID)
				if err != nil {
					return a.stop(ctx, j, err)
				}
				if cancel {
					return a.finish(ctx, j, JobCancelled, nil)
				}
				beat = time.Now()
			}
			if r.inDoubt {
				found, err := a.settleInDoubt(ctx, j, r)
				if err != nil {
					return a.finish(ctx, j, JobFailed, err)
				}
				if found {
					continue
				}
			}
			if interval > 0 {
				if !pglead.Sleep(ctx, time.Until(next)) {
					return a.stop(ctx, j, ctx.Err())
				}
				next = maxTime(next, time.Now()).Add(interval)
			}
			out, err := a.build(ctx, j, r.Record)
			if err != nil {
				if err := a.release(ctx, j.ID, r.ID, err.Error()); err != nil {
					return a.stop(ctx, j, err)
				}
				continue
			}
			if err := a.publish(ctx, j, r, pub, out); err != nil {
				if errors.Is(err, errCrash) || errors.Is(err, errLostJob) || ctx.Err() != nil {
					return a.stop(ctx, j, err)
				}
				return a.finish(ctx, j, JobFailed, fmt.Errorf("index: replay record %d: %w", r.ID, err))
			}
		}
	}
}

// errCrash is what a test's afterSend hook returns to stop a job as a
// crash would, between a send and its record.
var errCrash = errors.New("index: simulated crash")

// claimedRecords returns the next records job id holds, in id order.
func (a *Actions) claimedRecords(ctx context.Context, id int64) ([]claimed, error) {
	rows, err := a.store.db.Query(ctx, `SELECT `+recordCols+`, coalesce(publish_topic, ''), coalesce(publish_partition, 0),
		coalesce(publish_from, -1) FROM idem_dlq_records WHERE job_id = $1 AND status = 'replaying' ORDER BY id LIMIT 100`, id)
	if err != nil {
		return nil, fmt.Errorf("index: job %d: records: %w", id, err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (claimed, error) {
		var c claimed
		var err error
		c.Record, err = scanRecord(withExtra{row, []any{&c.publishTopic, &c.publishPartition, &c.publishFrom}})
		c.inDoubt = c.publishFrom >= 0
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("index: job %d: records: %w", id, err)
	}
	// Open the sealed payloads; a record whose payload cannot be read
	// (its key destroyed) keeps PayloadErr, and build refuses it.
	opened := make([]Record, len(recs))
	for i := range recs {
		opened[i] = recs[i].Record
	}
	if err := a.store.open(ctx, opened); err != nil {
		return nil, fmt.Errorf("index: job %d: records: %w", id, err)
	}
	for i := range recs {
		recs[i].Record = opened[i]
	}
	return recs, nil
}

// withExtra is a row whose Scan fills scanRecord's destinations and then
// extra ones, for queries selecting recordCols and more.
type withExtra struct {
	row   pgx.Row
	extra []any
}

func (w withExtra) Scan(dest ...any) error { return w.row.Scan(append(dest, w.extra...)...) }

// heartbeat refreshes job id's heartbeat and reports whether a cancel was
// asked; errLostJob when a no longer holds it.
func (a *Actions) heartbeat(ctx context.Context, id int64) (bool, error) {
	var cancel bool
	err := a.store.db.QueryRow(ctx, `UPDATE idem_dlq_jobs SET heartbeat_at = now() WHERE id = $1 AND owner = $2 AND state = 'running'
		RETURNING cancel_requested`, id, a.owner).Scan(&cancel)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, errLostJob
	}
	if err != nil {
		return false, fmt.Errorf("index: job %d: heartbeat: %w", id, err)
	}
	return cancel, nil
}

// build returns the record job j sends for r: a replay (forward.Replay), or
// the edit's stored value with the original key and headers.
func (a *Actions) build(ctx context.Context, j Job, r Record) (forward.Record, error) {
	if j.Action == "edit-retry" {
		if r.PayloadErr != nil {
			return forward.Record{}, fmt.Errorf("record %d: its value and headers cannot be read: %w", r.ID, r.PayloadErr)
		}
		v := []Version{{}}
		if err := a.store.db.QueryRow(ctx, `SELECT n, value, coalesce(key_id, 0) FROM idem_dlq_versions WHERE record_id = $1 AND published_to IS NULL
			ORDER BY n DESC LIMIT 1`, r.ID).Scan(&v[0].N, &v[0].Value, &v[0].KeyID); err != nil {
			return forward.Record{}, fmt.Errorf("record %d: the edited value: %w", r.ID, err)
		}
		if err := a.store.openVersions(ctx, r.ID, v); err != nil {
			return forward.Record{}, fmt.Errorf("record %d: the edited value: %w", r.ID, err)
		}
		if v[0].PayloadErr != nil {
			return forward.Record{}, fmt.Errorf("record %d: the edited value cannot be read: %w", r.ID, v[0].PayloadErr)
		}
		return editRecord(r, v[0].Value), nil
	}
	dl, err := a.deadLetter(ctx, r)
	if err != nil {
		return forward.Record{}, err
	}
	out, err := forward.Replay(dl, j.To, 0, time.Now())
	if err != nil {
		return forward.Record{}, fmt.Errorf("record %d: %w", r.ID, err)
	}
	return out, nil
}

// publish sends out for r: it stores where the record goes and that
// partition's end offset first, then sends, then marks r replayed.
func (a *Actions) publish(ctx context.Context, j Job, r claimed, pub *publisher, out forward.Record) error {
	part, err := pub.partition(out)
	if err != nil {
		return err
	}
	from, err := a.client.GetOffset(out.Topic, part, sarama.OffsetNewest)
	if err != nil {
		return fmt.Errorf("end offset of %s/%d: %w", out.Topic, part, err)
	}
	tag, err := a.store.db.Exec(ctx, `UPDATE idem_dlq_records SET publish_topic = $3, publish_partition = $4, publish_from = $5
		WHERE id = $1 AND job_id = $2 AND status = 'replaying'
		AND EXISTS (SELECT 1 FROM idem_dlq_jobs WHERE id = $2 AND owner = $6 AND state = 'running')`, r.ID, j.ID, out.Topic, part, from, a.owner)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return errLostJob // released, or the job is no longer a's
	}
	off, err := pub.sendTo(ctx, out, part)
	if err != nil {
		return err
	}
	if a.afterSend != nil {
		if err := a.afterSend(r.ID); err != nil {
			return err
		}
	}
	return a.settle(ctx, j, r.ID, out.Topic, part, off)
}

// settle marks record id published at topic/partition/offset by job j.
func (a *Actions) settle(ctx context.Context, j Job, id int64, topic string, partition int32, offset int64) error {
	return pgx.BeginFunc(context.WithoutCancel(ctx), a.store.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE idem_dlq_records SET status = 'replayed', status_at = now(), publish_from = NULL
			WHERE id = $1 AND job_id = $2 AND status = 'replaying'`, id, j.ID)
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		if j.Action == "edit-retry" {
			if _, err := tx.Exec(ctx, `UPDATE idem_dlq_versions SET published_to = $2, published_partition = $3, published_offset = $4
				WHERE record_id = $1 AND published_to IS NULL`, id, topic, partition, offset); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `UPDATE idem_dlq_jobs SET done = done + 1 WHERE id = $1`, j.ID)
		return err
	})
}

// settleInDoubt looks for r in the partition its send went to, from the
// end offset stored before the send: a record there whose idem-replay-of
// names r's dead letter means the send happened (r is marked published,
// found is true); none means it did not.
func (a *Actions) settleInDoubt(ctx context.Context, j Job, r claimed) (found bool, err error) {
	end, err := committed.End(a.client, r.publishTopic, r.publishPartition)
	if err != nil {
		return false, fmt.Errorf("index: record %d: was it published? %w", r.ID, err)
	}
	want := wire.ReplayOf(r.Topic, r.Partition, r.Offset)
	var at int64 = -1
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err = committed.Read(rctx, a.client, r.publishTopic, r.publishPartition, r.publishFrom, end, doubtWait, func(m *sarama.ConsumerMessage) error {
		for _, h := range m.Headers {
			if string(h.Key) == wire.HeaderReplayOf && string(h.Value) == want {
				at = m.Offset
				cancel()
			}
		}
		return nil
	})
	if at >= 0 {
		return true, a.settle(ctx, j, r.ID, r.publishTopic, r.publishPartition, at)
	}
	if err != nil {
		return false, fmt.Errorf("index: record %d: was it published? reading %s/%d from %d: %w", r.ID, r.publishTopic, r.publishPartition, r.publishFrom, err)
	}
	return false, nil
}

// release gives record id back (unresolved) from job jobID, naming why in
// the job's errors when why is not empty.
func (a *Actions) release(ctx context.Context, jobID, id int64, why string) error {
	return pgx.BeginFunc(context.WithoutCancel(ctx), a.store.db, func(tx pgx.Tx) error {
		if err := releaseRecords(ctx, tx, jobID, []int64{id}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE idem_dlq_jobs SET skipped = skipped + 1,
			errors = CASE WHEN $2 = '' THEN errors ELSE array_append(errors, $2) END WHERE id = $1`, jobID, clean(why))
		return err
	})
}

// releaseRecords gives the records of jobID back (unresolved): those in
// ids, or all it still holds when ids is nil. An edit's unpublished value is
// dropped.
func releaseRecords(ctx context.Context, tx pgx.Tx, jobID int64, ids []int64) error {
	rows, err := tx.Query(ctx, `UPDATE idem_dlq_records SET status = 'unresolved', job_id = NULL, status_actor = '', status_reason = '',
		status_at = now(), publish_topic = NULL, publish_partition = NULL, publish_from = NULL
		WHERE job_id = $1 AND status = 'replaying' AND ($2::bigint[] IS NULL OR id = ANY($2)) RETURNING id`, jobID, ids)
	if err != nil {
		return err
	}
	released, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `DELETE FROM idem_dlq_versions WHERE record_id = ANY($1) AND published_to IS NULL`, released)
	return err
}

// stop ends a's run of job j without finishing it: the job is handed back
// (owner cleared) for ResumeJobs, unless err is errLostJob (it is someone
// else's already). A simulated crash (errCrash) leaves everything as a dead
// process would.
func (a *Actions) stop(ctx context.Context, j Job, err error) (Job, error) {
	if !errors.Is(err, errLostJob) && !errors.Is(err, errCrash) {
		_, _ = a.store.db.Exec(context.WithoutCancel(ctx), `UPDATE idem_dlq_jobs SET owner = NULL, heartbeat_at = NULL
			WHERE id = $1 AND owner = $2 AND state = 'running'`, j.ID, a.owner)
	}
	return j, err
}

// finish ends job j in state: the records it still holds are settled (a
// send in doubt is looked for first) or given back, the job's row records
// the end, and the audit log the outcome. It returns the job and, for a
// failed job, an error.
func (a *Actions) finish(ctx context.Context, j Job, state JobState, cause error) (Job, error) {
	wctx := context.WithoutCancel(ctx)
	if state != JobDone {
		recs, err := a.claimedRecords(wctx, j.ID)
		for err == nil && len(recs) > 0 {
			var ids []int64
			for _, r := range recs {
				if r.inDoubt && a.client != nil {
					found, derr := a.settleInDoubt(wctx, j, r)
					if found {
						continue
					}
					if derr != nil {
						_ = a.release(wctx, j.ID, r.ID, derr.Error()+"; it may have been published once already (with its idempotency key: a second copy is a duplicate the consumer drops)")
						continue
					}
				}
				ids = append(ids, r.ID)
			}
			if len(ids) > 0 {
				err = pgx.BeginFunc(wctx, a.store.db, func(tx pgx.Tx) error {
					if err := releaseRecords(wctx, tx, j.ID, ids); err != nil {
						return err
					}
					_, err := tx.Exec(wctx, `UPDATE idem_dlq_jobs SET skipped = skipped + $2 WHERE id = $1`, j.ID, len(ids))
					return err
				})
			}
			if err == nil {
				recs, err = a.claimedRecords(wctx, j.ID)
			}
		}
		if err != nil {
			return a.stop(ctx, j, err)
		}
	}
	if cause != nil {
		if _, err := a.store.db.Exec(wctx, `UPDATE idem_dlq_jobs SET errors = array_append(errors, $2) WHERE id = $1`, j.ID, clean(cause.Error())); err != nil {
			return a.stop(ctx, j, err)
		}
	}
	var err error
	j, err = scanJob(a.store.db.QueryRow(wctx, `UPDATE idem_dlq_jobs SET state = $2, finished_at = now(), owner = NULL, heartbeat_at = NULL
		WHERE id = $1 AND owner = $3 AND state = 'running' RETURNING `+jobCols, j.ID, string(state), a.owner))
	if errors.Is(err, pgx.ErrNoRows) {
		return a.stop(ctx, j, errLostJob)
	}
	if err != nil {
		return a.stop(ctx, j, fmt.Errorf("index: job %d: finish: %w", j.ID, err))
	}
	done := "replayed"
	if j.Action == "edit-retry" {
		done = "published"
	}
	res := j.Result()
	result := auditResult(res, nil, done)
	switch state {
	case JobCancelled:
		result = fmt.Sprintf("cancelled by %s: %s", j.CancelledBy, result)
	case JobFailed:
		result = auditResult(res, cause, done)
	}
	aerr := writeAudit(wctx, a.store.db, AuditEntry{Actor: j.Actor, Action: j.Action, RecordIDs: j.RecordIDs, Detail: j.Detail,
		Reason: j.Reason, Result: result})
	if state == JobFailed {
		return j, errors.Join(cause, aerr)
	}
	return j, aerr
}

// ResumeJobs takes over every running job no process holds (handed back, or
// whose heartbeat is older than the lease) and returns their ids; run each
// with RunJob.
func (a *Actions) ResumeJobs(ctx context.Context) ([]int64, error) {
	rows, err := a.store.db.Query(ctx, `UPDATE idem_dlq_jobs SET owner = $1, heartbeat_at = now()
		WHERE id IN (SELECT id FROM idem_dlq_jobs WHERE state = 'running' AND (owner IS NULL OR heartbeat_at IS NULL
			OR heartbeat_at < now() - $2::interval) ORDER BY id FOR UPDATE SKIP LOCKED)
		RETURNING id`, a.owner, a.lease)
	if err != nil {
		return nil, fmt.Errorf("index: resume jobs: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("index: resume jobs: %w", err)
	}
	slices.Sort(ids)
	return ids, nil
}

// CancelJob asks job id to stop: the records it has not published go back
// to unresolved, and it ends cancelled (audited, by actor). A job that has
// ended already is returned as it is. The job's holder sees the request
// within a second; when no process holds the job (it waits to be resumed),
// CancelJob takes it over and cancels it itself. It returns the job as it
// is after the request.
func (a *Actions) CancelJob(ctx context.Context, actor string, id int64) (Job, error) {
	if err := checkActor(actor); err != nil {
		return Job{}, err
	}
	j, err := scanJob(a.store.db.QueryRow(ctx, `UPDATE idem_dlq_jobs SET cancel_requested = true, cancelled_by = $2
		WHERE id = $1 AND state = 'running' RETURNING `+jobCols, id, clean(actor)))
	if errors.Is(err, pgx.ErrNoRows) {
		return a.store.Job(ctx, id)
	}
	if err != nil {
		return j, fmt.Errorf("index: cancel job %d: %w", id, err)
	}
	var took bool
	if err := a.store.db.QueryRow(ctx, `UPDATE idem_dlq_jobs SET owner = $2, heartbeat_at = now() WHERE id = $1 AND state = 'running'
		AND (owner IS NULL OR heartbeat_at IS NULL OR heartbeat_at < now() - $3::interval) RETURNING true`, id, a.owner, a.lease).Scan(&took); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return j, fmt.Errorf("index: cancel job %d: %w", id, err)
	}
	if took {
		return a.RunJob(ctx, id)
	}
	return j, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// deadLetter rebuilds r as a replay reads a dead letter (what
// forward.Replay takes); a truncated value is read back from the DLQ topic.
func (a *Actions) deadLetter(ctx context.Context, r Record) (forward.DeadLetter, error) {
	if r.PayloadErr != nil {
		return forward.DeadLetter{}, fmt.Errorf("record %d: its value and headers cannot be read: %w", r.ID, r.PayloadErr)
	}
	if r.ValueTruncated {
		got, err := dlq.New(a.client).Show(ctx, r.Topic, dlq.Position{Partition: r.Partition, Offset: r.Offset})
		if err != nil {
			return forward.DeadLetter{}, fmt.Errorf("record %d: the index holds its value truncated (%d of %d bytes) and it cannot be read from %s/%d offset %d: %w",
				r.ID, len(r.Value), r.ValueSize, r.Topic, r.Partition, r.Offset, err)
		}
		return forward.DeadLetter{Topic: got.Topic, Partition: got.Partition, Offset: got.Offset, Key: got.Key, Value: got.Value,
			Headers: got.Headers, Failure: got.Failure, HasFailure: got.HasFailure}, nil
	}
	hs := make([]sarama.RecordHeader, len(r.Headers))
	for i, h := range r.Headers {
		hs[i] = sarama.RecordHeader{Key: h.Key, Value: h.Value}
	}
	f, ok, _ := wire.Decode(hs) // as dlq.FromMessage: a header that does not parse leaves its field zero
	return forward.DeadLetter{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Value: r.Value,
		Headers: hs, Failure: f, HasFailure: ok}, nil
}

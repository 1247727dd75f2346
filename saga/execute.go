package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/correlation"
)

// rollbackTimeout bounds a rollback run after the caller's ctx is done.
const rollbackTimeout = 5 * time.Second

// row is the part of idem_saga a transition reads, under the row's lock.
type row struct {
	id, typ  string
	corr     string // correlation_id
	state    State
	step     int
	input    []byte
	deadline *time.Time
	expired  bool
}

// Execute drives saga id until it is final (Completed, Compensated), Waiting
// for a reply, or cannot go on now (an outage, or a compensation still
// failing after Config.CompensationAttempts; the saga is left due for RunDue
// after a backoff). It returns the state it stopped in.
//
// Each step is one transaction that holds the saga row's lock (SELECT … FOR
// UPDATE SKIP LOCKED): the action runs inside it, and its outcome, the
// action's writes through Call.Tx and the saga's next state commit together.
// A crash anywhere before that commit leaves the step to run again, with the
// same Call.Key, by whichever orchestrator drives the saga next. If another
// orchestrator holds the row, Execute returns ErrBusy.
func (o *Orchestrator) Execute(ctx context.Context, id string) (State, error) {
	var at struct {
		idx   int
		state State
		fails int
	}
	at.idx = -2
	for {
		if err := ctx.Err(); err != nil {
			return "", fmt.Errorf("saga: %s: %w", id, err)
		}
		st, more, err := o.transition(ctx, id, func(idx int, state State) *int {
			if idx != at.idx || state != at.state {
				at.idx, at.state, at.fails = idx, state, 0
			}
			return &at.fails
		})
		if err != nil || !more {
			return st, err
		}
	}
}

// transition makes one transition of saga id in one transaction. more
// reports whether Execute should go on. fails returns the failure count of
// the step (and phase) about to run, kept across transitions by Execute.
func (o *Orchestrator) transition(ctx context.Context, id string, fails func(int, State) *int) (_ State, more bool, err error) {
	tx, err := o.cfg.DB.Begin(ctx)
	if err != nil {
		return "", false, fmt.Errorf("saga: %s: begin: %w", id, err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		_ = tx.Rollback(rctx) // after Commit: a no-op
		cancel()
	}()
	s := row{id: id}
	err = tx.QueryRow(ctx, `SELECT type, state, step, input, deadline, coalesce(deadline <= now(), false), correlation_id
		FROM idem_saga WHERE id = $1 FOR UPDATE SKIP LOCKED`, id).Scan(&s.typ, &s.state, &s.step, &s.input, &s.deadline, &s.expired, &s.corr)
	if errors.Is(err, pgx.ErrNoRows) {
		var one int
		if err := o.cfg.DB.QueryRow(ctx, `SELECT 1 FROM idem_saga WHERE id = $1`, id).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
			return "", false, fmt.Errorf("%w: %q", ErrNotFound, id)
		}
		return "", false, fmt.Errorf("%w: %q", ErrBusy, id)
	}
	if err != nil {
		return "", false, fmt.Errorf("saga: %s: lock: %w", id, err)
	}
	def, ok := o.defs[s.typ]
	if !ok {
		return s.state, false, fmt.Errorf("saga: %s: type %q has no Definition in this orchestrator", id, s.typ)
	}
	switch {
	case s.state.Final():
		return s.state, false, nil
	case (s.state == Running || s.state == Waiting) && s.expired:
		from := s.step - 1 // the step about to run has no effect yet
		if s.state == Waiting {
			from = s.step // the pending step may have acted: compensate it too
		}
		return o.move(ctx, tx, s, Compensating, from, "deadline exceeded")
	case s.state == Waiting:
		return Waiting, false, nil
	case s.state == Running && s.step >= len(def.Steps):
		return o.move(ctx, tx, s, Completed, s.step, "")
	case s.state == Running:
		return o.act(ctx, tx, s, def, fails(s.step, Running))
	case s.step < 0:
		return o.move(ctx, tx, s, Compensated, -1, "")
	default:
		return o.compensate(ctx, tx, s, def, fails(s.step, Compensating))
	}
}

// hit calls the test hook at a boundary.
func (o *Orchestrator) hit(point string) error {
	if o.boundary == nil {
		return nil
	}
	return o.boundary(point)
}

// move sets the saga's state and step, and commits.
func (o *Orchestrator) move(ctx context.Context, tx pgx.Tx, s row, to State, step int, reason string) (State, bool, error) {
	if err := o.hit("saga:" + string(to)); err != nil {
		return s.state, false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE idem_saga SET state = $2, step = $3, error = CASE WHEN $4 = '' THEN error ELSE $4 END,
		next_at = now(), updated_at = now() WHERE id = $1`, s.id, to, step, reason); err != nil {
		return s.state, false, fmt.Errorf("saga: %s: set %s: %w", s.id, to, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return s.state, false, fmt.Errorf("saga: %s: commit %s: %w", s.id, to, err)
	}
	if to != s.state {
		o.m.Transitions.WithLabelValues(s.typ, string(to)).Inc()
	}
	return to, !to.Final(), nil
}

// results returns the results of the saga's done steps.
func results(ctx context.Context, tx pgx.Tx, id string) (map[string][]byte, error) {
	rows, err := tx.Query(ctx, `SELECT name, result FROM idem_saga_step WHERE saga_id = $1 AND state = 'done'`, id)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	var name string
	var res []byte
	_, err = pgx.ForEachRow(rows, []any{&name, &res}, func() error {
		out[name] = res
		return nil
	})
	return out, err
}

// call builds the Call of step s.step, with the action's savepoint.
func (o *Orchestrator) call(ctx context.Context, tx pgx.Tx, s row, name, suffix string) (Call, pgx.Tx, error) {
	res, err := results(ctx, tx, s.id)
	if err != nil {
		return Call{}, nil, fmt.Errorf("saga: %s: read results: %w", s.id, err)
	}
	sp, err := tx.Begin(ctx) // a savepoint: a failed call's writes roll back alone
	if err != nil {
		return Call{}, nil, fmt.Errorf("saga: %s: savepoint: %w", s.id, err)
	}
	return Call{SagaID: s.id, Step: name, Key: s.id + "/" + name + suffix, Input: s.input, Results: res,
		CorrelationID: s.corr, Tx: sp}, sp, nil
}

// act runs the action of step s.step and records its outcome.
func (o *Orchestrator) act(ctx context.Context, tx pgx.Tx, s row, def *Definition, fails *int) (State, bool, error) {
	step := def.Steps[s.step]
	if err := o.hit(step.Name + ":action:before"); err != nil {
		return s.state, false, err
	}
	c, sp, err := o.call(ctx, tx, s, step.Name, "")
	if err != nil {
		return s.state, false, err
	}
	actx, cancel := correlation.With(ctx, s.corr), context.CancelFunc(func() {})
	if s.deadline != nil {
		actx, cancel = context.WithDeadline(actx, *s.deadline)
	}
	start := time.Now()
	result, aerr := step.Action(actx, c)
	cancel()
	took := time.Since(start).Seconds()
	pending := errors.Is(aerr, ErrPending)
	if aerr != nil && !pending {
		_ = sp.Rollback(ctx)
		return o.actFailed(ctx, tx, s, step, *fails+1, aerr, took, fails)
	}
	if err := sp.Commit(ctx); err != nil {
		return s.state, false, fmt.Errorf("saga: %s/%s: release savepoint: %w", s.id, step.Name, err)
	}
	if err := o.hit(step.Name + ":action:after"); err != nil {
		return s.state, false, err
	}
	stepState, to, next, label := "done", Running, s.step+1, "ok"
	if pending {
		stepState, to, next, label, result = "pending", Waiting, s.step, "pending", nil
	}
	if err := o.record(ctx, tx, s, step.Name, stepState, result, *fails+1, ""); err != nil {
		return s.state, false, err
	}
	o.m.StepDuration.WithLabelValues(s.typ, step.Name, label).Observe(took)
	st, more, err := o.move(ctx, tx, s, to, next, "")
	if err == nil {
		err = o.hit(step.Name + ":action:committed")
	}
	return st, more && err == nil, err
}

// record writes step s.step's row.
func (o *Orchestrator) record(ctx context.Context, tx pgx.Tx, s row, name, state string, result []byte, attempts int, reason string) error {
	_, err := tx.Exec(ctx, `INSERT INTO idem_saga_step (saga_id, idx, name, state, result, attempts, error)
		VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (saga_id, idx) DO UPDATE SET state = excluded.state, result = excluded.result,
			attempts = excluded.attempts, error = excluded.error, finished_at = now()`,
		s.id, s.step, name, state, result, attempts, reason)
	if err != nil {
		return fmt.Errorf("saga: %s/%s: record %s: %w", s.id, name, state, err)
	}
	return nil
}

// actFailed handles an action's error: the caller's ctx ended, an outage,
// an attempt to retry, or the step's failure (then the saga compensates).
func (o *Orchestrator) actFailed(ctx context.Context, tx pgx.Tx, s row, step Step, attempt int, aerr error, took float64, fails *int) (State, bool, error) {
	name := step.Name
	switch {
	case ctx.Err() != nil:
		return s.state, false, fmt.Errorf("saga: %s/%s: %w", s.id, name, ctx.Err())
	case breaker.IsOpen(aerr):
		o.m.StepDuration.WithLabelValues(s.typ, name, "outage").Observe(took)
		after, _ := breaker.RetryAfter(aerr)
		_ = tx.Rollback(ctx)
		if _, err := o.cfg.DB.Exec(ctx, `UPDATE idem_saga SET next_at = now() + $2::interval WHERE id = $1`, s.id, after); err != nil {
			return s.state, false, fmt.Errorf("saga: %s/%s: %w (and delaying it: %v)", s.id, name, aerr, err)
		}
		return s.state, false, fmt.Errorf("saga: %s/%s: dependency down, retry after %v: %w", s.id, name, after, aerr)
	}
	o.m.StepDuration.WithLabelValues(s.typ, name, "error").Observe(took)
	o.cfg.Logger.WarnContext(ctx, "saga step failed", "saga", s.id, "type", s.typ, "step", name, "attempt", attempt, "error", aerr)
	expired := s.deadline != nil && !time.Now().Before(*s.deadline)
	if attempt < o.cfg.StepAttempts && !handler.IsPermanent(aerr) && !expired {
		*fails = attempt
		_ = tx.Rollback(ctx)
		if err := wait(ctx, o.backoff(attempt)); err != nil {
			return s.state, false, fmt.Errorf("saga: %s/%s: %w", s.id, name, err)
		}
		return s.state, true, nil
	}
	if expired {
		return o.move(ctx, tx, s, Compensating, s.step-1, "deadline exceeded")
	}
	if err := o.record(ctx, tx, s, name, "failed", nil, attempt, aerr.Error()); err != nil {
		return s.state, false, err
	}
	return o.move(ctx, tx, s, Compensating, s.step-1, name+": "+aerr.Error())
}

// compensate undoes step s.step if it is done (or pending), then moves to
// the step before it.
func (o *Orchestrator) compensate(ctx context.Context, tx pgx.Tx, s row, def *Definition, fails *int) (State, bool, error) {
	step := def.Steps[s.step]
	var state string
	err := tx.QueryRow(ctx, `SELECT state FROM idem_saga_step WHERE saga_id = $1 AND idx = $2`, s.id, s.step).Scan(&state)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return s.state, false, fmt.Errorf("saga: %s/%s: read step: %w", s.id, step.Name, err)
	}
	if (state == "done" || state == "pending") && step.Compensate != nil {
		if err := o.hit(step.Name + ":compensate:before"); err != nil {
			return s.state, false, err
		}
		c, sp, err := o.call(ctx, tx, s, step.Name, "/compensate")
		if err != nil {
			return s.state, false, err
		}
		start := time.Now()
		cerr := step.Compensate(correlation.With(ctx, s.corr), c)
		o.m.CompensationDuration.WithLabelValues(s.typ, step.Name).Observe(time.Since(start).Seconds())
		if cerr != nil {
			_ = sp.Rollback(ctx)
			return o.compensationFailed(ctx, tx, s, step.Name, cerr, fails)
		}
		if err := sp.Commit(ctx); err != nil {
			return s.state, false, fmt.Errorf("saga: %s/%s: release savepoint: %w", s.id, step.Name, err)
		}
		o.m.Compensations.WithLabelValues(s.typ, step.Name, "ok").Inc()
		if err := o.hit(step.Name + ":compensate:after"); err != nil {
			return s.state, false, err
		}
	}
	if state == "done" || state == "pending" {
		if _, err := tx.Exec(ctx, `UPDATE idem_saga_step SET state = 'compensated', compensated_at = now()
			WHERE saga_id = $1 AND idx = $2`, s.id, s.step); err != nil {
			return s.state, false, fmt.Errorf("saga: %s/%s: record compensated: %w", s.id, step.Name, err)
		}
	}
	st, more, err := o.move(ctx, tx, s, Compensating, s.step-1, "")
	if err == nil {
		err = o.hit(step.Name + ":compensate:committed")
	}
	return st, more && err == nil, err
}

// compensationFailed counts a failed compensation (comp_attempts of the
// step), delays the saga by compensationBackoff of that count, and waits to
// call it again, or leaves it due for RunDue later: after
// Config.CompensationAttempts calls in this Execute, or once the delay
// exceeds Config.BackoffMax.
func (o *Orchestrator) compensationFailed(ctx context.Context, tx pgx.Tx, s row, name string, cerr error, fails *int) (State, bool, error) {
	o.m.Compensations.WithLabelValues(s.typ, name, "error").Inc()
	_ = tx.Rollback(ctx)
	if ctx.Err() != nil {
		return s.state, false, fmt.Errorf("saga: %s/%s: compensate: %w", s.id, name, ctx.Err())
	}
	*fails++
	var total int
	if err := o.cfg.DB.QueryRow(ctx, `UPDATE idem_saga_step SET comp_attempts = comp_attempts + 1, error = $3
		WHERE saga_id = $1 AND idx = $2 RETURNING comp_attempts`, s.id, s.step, "compensate: "+cerr.Error()).Scan(&total); err != nil {
		return s.state, false, fmt.Errorf("saga: %s/%s: compensate: %w (and recording it: %v)", s.id, name, cerr, err)
	}
	delay := o.compensationBackoff(total)
	o.cfg.Logger.WarnContext(ctx, "saga compensation failed", "saga", s.id, "type", s.typ, "step", name,
		"attempt", total, "retry_in", delay, "error", cerr)
	if _, err := o.cfg.DB.Exec(ctx, `UPDATE idem_saga SET next_at = now() + $2::interval, updated_at = now() WHERE id = $1`,
		s.id, delay); err != nil {
		return s.state, false, fmt.Errorf("saga: %s/%s: compensate: %w (and delaying it: %v)", s.id, name, cerr, err)
	}
	if *fails >= o.cfg.CompensationAttempts || delay > o.cfg.BackoffMax {
		return s.state, false, fmt.Errorf("saga: %s/%s: %w after %d attempts (next in %v): %w", s.id, name, errCompensationFailing, total, delay, cerr)
	}
	if err := wait(ctx, delay); err != nil {
		return s.state, false, fmt.Errorf("saga: %s/%s: %w", s.id, name, err)
	}
	return s.state, true, nil
}

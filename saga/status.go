package saga

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/dedupe"
)

// Status is a saga's row and its steps' rows, as Get returns them.
type Status struct {
	ID    string `json:"id"`
	Type  string `json:"type"`
	State State  `json:"state"`
	// Step is the index of the next step to run (Running, Waiting: the
	// pending one) or to compensate (Compensating).
	Step int `json:"step"`
	// Error is why the saga compensates ("<step>: <error>", "deadline
	// exceeded"); empty otherwise.
	Error string `json:"error,omitempty"`
	// CorrelationID is the correlation id every step and compensation
	// carries (see Call.CorrelationID).
	CorrelationID string       `json:"correlation_id"`
	Deadline      time.Time    `json:"deadline,omitzero"`
	CreatedAt     time.Time    `json:"created_at"`
	UpdatedAt     time.Time    `json:"updated_at"`
	Steps         []StepStatus `json:"steps"`
}

// StepStatus is one recorded step.
type StepStatus struct {
	Name string `json:"name"`
	// State is pending, done, failed or compensated.
	State  string `json:"state"`
	Result []byte `json:"result,omitempty"`
	// Error is the action's last error (failed) or the compensation's last
	// error (while it is retried).
	Error string `json:"error,omitempty"`
	// Attempts is how many calls of the action it took; CompAttempts counts
	// failed compensation calls.
	Attempts     int `json:"attempts"`
	CompAttempts int `json:"compensation_attempts,omitempty"`
}

// Get returns saga id's status, or ErrNotFound. db may be a pool or a
// transaction; the saga's row and its steps are read in one transaction of
// their own (a savepoint in db's).
func Get(ctx context.Context, db dedupe.DB, id string) (Status, error) {
	q, err := db.Begin(ctx)
	if err != nil {
		return Status{}, fmt.Errorf("saga: get %s: %w", id, err)
	}
	defer func() { _ = q.Rollback(context.WithoutCancel(ctx)) }() // it only read
	s := Status{ID: id}
	var deadline *time.Time
	err = q.QueryRow(ctx, `SELECT type, state, step, error, deadline, created_at, updated_at, correlation_id FROM idem_saga WHERE id = $1`, id).
		Scan(&s.Type, &s.State, &s.Step, &s.Error, &deadline, &s.CreatedAt, &s.UpdatedAt, &s.CorrelationID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Status{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if err != nil {
		return Status{}, fmt.Errorf("saga: get %s: %w", id, err)
	}
	if deadline != nil {
		s.Deadline = *deadline
	}
	rows, err := q.Query(ctx, `SELECT name, state, result, error, attempts, comp_attempts FROM idem_saga_step
		WHERE saga_id = $1 ORDER BY idx`, id)
	if err != nil {
		return Status{}, fmt.Errorf("saga: get %s steps: %w", id, err)
	}
	s.Steps, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (StepStatus, error) {
		var st StepStatus
		return st, r.Scan(&st.Name, &st.State, &st.Result, &st.Error, &st.Attempts, &st.CompAttempts)
	})
	if err != nil {
		return Status{}, fmt.Errorf("saga: get %s steps: %w", id, err)
	}
	return s, nil
}

// RunDue drives, one after another, up to 100 sagas that are due: Running
// or Compensating with next_at passed, and Waiting past their deadline. Only
// sagas of the types this orchestrator has a Definition for are read, so
// sagas of other types (another service's orchestrator, a retired type)
// never take its turn. It returns how many it drove to a stop and the
// errors of the others, joined (ErrBusy is not an error here: another
// orchestrator has that saga).
func (o *Orchestrator) RunDue(ctx context.Context) (int, error) {
	var ids []string
	err := o.cfg.DB.QueryRow(ctx, `SELECT coalesce(array_agg(id ORDER BY next_at), '{}') FROM (SELECT id, next_at FROM idem_saga
		WHERE ((state IN ('running', 'compensating') AND next_at <= now()) OR (state = 'waiting' AND deadline <= now()))
		  AND type = ANY($1)
		ORDER BY next_at LIMIT 100) due`, o.types).Scan(&ids)
	if err != nil {
		return 0, fmt.Errorf("saga: find due sagas: %w", err)
	}
	var errs []error
	n := 0
	for _, id := range ids {
		_, err := o.Execute(ctx, id)
		switch {
		case err == nil:
			n++
		case errors.Is(err, ErrBusy):
		default:
			errs = append(errs, err)
		}
	}
	return n, errors.Join(errs...)
}

// Run calls RunDue every Config.PollInterval until ctx is done, and then
// returns nil. Errors of single sagas are logged, not returned: a saga that
// cannot go on now is tried again when it is next due.
func (o *Orchestrator) Run(ctx context.Context) error {
	t := time.NewTicker(o.cfg.PollInterval)
	defer t.Stop()
	for {
		if _, err := o.RunDue(ctx); err != nil && ctx.Err() == nil {
			o.cfg.Logger.WarnContext(ctx, "saga: some sagas could not go on", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

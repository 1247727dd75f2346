package saga

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/internal/correlation"
)

// State is a saga's state, stored in idem_saga.state.
type State string

// Saga states. Completed and Compensated are final.
const (
	// Running: the next step is due to run.
	Running State = "running"
	// Waiting: a step returned ErrPending and waits for Complete or Fail.
	Waiting State = "waiting"
	// Compensating: a step failed (or the deadline passed); the completed
	// steps are being compensated, last first.
	Compensating State = "compensating"
	// Completed: every step is done.
	Completed State = "completed"
	// Compensated: every completed step was compensated.
	Compensated State = "compensated"
)

// Final reports whether s is Completed or Compensated.
func (s State) Final() bool { return s == Completed || s == Compensated }

// Errors.
var (
	// ErrPending is returned by a Step.Action that has started its work but
	// does not have the result yet, typically after enqueuing a command
	// through Call.Tx (the outbox) whose reply an idem consumer will receive.
	// The step and the action's writes are committed; the saga is Waiting
	// until Complete or Fail is called for that step, or its deadline passes.
	ErrPending = errors.New("saga: step pending")
	// ErrNotFound is returned for a saga id with no row.
	ErrNotFound = errors.New("saga: no such saga")
	// ErrBusy is returned by Execute when another orchestrator holds the
	// saga's row right now; it is driving the saga, so there is nothing to do.
	ErrBusy = errors.New("saga: driven by another orchestrator")
	// ErrNotPending is returned by Complete and Fail when the step is not
	// pending (never started, failed, compensated, or the saga gave up
	// waiting). A step already done makes Complete a no-op instead.
	ErrNotPending = errors.New("saga: step is not pending")
	// errInvalidConfig prefixes every problem New reports; each names the field.
	errInvalidConfig = errors.New("saga: invalid configuration")

	// errCompensationFailing is wrapped by Execute's error when a
	// compensation still fails after Config.CompensationAttempts attempts,
	// with the compensation's own error. The saga stays Compensating (the
	// State Execute returns says so); RunDue tries again after a backoff.
	errCompensationFailing = errors.New("saga: compensation failing")
)

// Call is what a step's action or compensation gets.
type Call struct {
	// SagaID is the saga's id, as given to Start.
	SagaID string
	// Step is the step's name.
	Step string
	// Key is the idempotency key of this call: SagaID + "/" + Step for the
	// action, with "/compensate" appended for the compensation. It is the
	// same on every attempt, after any crash, so pass it to the service the
	// step calls (an Idempotency-Key header, the outbox message's
	// idempotency-key) and the service applies the effect at most once.
	Key string
	// Input is the saga's input, as given to Start.
	Input []byte
	// Results holds the results of the steps done so far, by step name. A
	// compensation finds its own step's result there.
	Results map[string][]byte
	// CorrelationID is the saga's correlation id: that of the ctx Start was
	// called with (outbox.WithCorrelationID, or in an idem handler the consumed message's), or the
	// saga's id when it had none. The action's and the compensation's ctx
	// carry it too, so an outbox.Enqueue there puts it on the command.
	CorrelationID string
	// Tx is the transaction that records this step's outcome. Writes made
	// through it (local effects, outbox.Enqueue of a command) commit if and
	// only if the outcome is recorded, so they happen exactly once. Do not
	// commit or roll it back.
	Tx pgx.Tx
}

// Step is one step of a saga.
type Step struct {
	// Name identifies the step in the saga's rows, keys, metrics and
	// Complete calls. Required, unique within the Definition; keep it stable
	// while sagas of the type may be in flight.
	Name string
	// Action does the step's work and returns its result (kept for later
	// steps and the compensation; may be nil). Return ErrPending to wait for
	// an asynchronous reply. An error fails the step: it is retried up to
	// Config.StepAttempts times with backoff (at once if it wraps
	// handler.Permanent), then the saga compensates. An error wrapping a
	// breaker *OpenError is an outage: the step is neither failed nor
	// counted, and the saga is retried after the breaker's RetryAfter.
	// A failed action must have had no effect: its Tx writes are rolled
	// back, and it is not compensated. Required.
	Action func(ctx context.Context, c Call) ([]byte, error)
	// Compensate undoes a done (or pending, if the deadline passed while
	// waiting) step. It must be idempotent by c.Key and succeed eventually:
	// it is retried with backoff until it does. nil: nothing to undo.
	Compensate func(ctx context.Context, c Call) error
}

// Definition is a saga type: its ordered steps and its deadline.
type Definition struct {
	// Type names the saga type (the metrics' type label). Required.
	Type string
	// Steps run in order. At least one is required.
	Steps []Step
	// Timeout is the per-saga deadline, counted from Start. A saga still
	// Running or Waiting at its deadline compensates; actions get a ctx
	// with that deadline. Default: 0, no deadline.
	Timeout time.Duration
}

// Config configures an Orchestrator. The zero value of every field but DB
// is its default.
type Config struct {
	// DB holds the saga tables (created by idem.Migrate). Required.
	DB dedupe.DB
	// StepAttempts is how many times one Execute calls a failing action
	// before the step fails. Default: 3.
	StepAttempts int
	// CompensationAttempts is how many times one Execute calls a failing
	// compensation before it returns an error with the saga still
	// Compensating (RunDue tries again later). Default: 5.
	CompensationAttempts int
	// BackoffBase and BackoffMax bound the full-jitter exponential backoff
	// between attempts: attempt n waits a random duration in
	// [0, min(BackoffMax, BackoffBase·2^(n-1))].
	// Default: 100ms and 10s.
	BackoffBase, BackoffMax time.Duration
	// CompensationBackoffMax caps the wait before a failing compensation is
	// called again. The n-th failed call of a step's compensation (counted
	// in idem_saga_step.comp_attempts, so across Execute calls, RunDue
	// rounds and processes) sets the saga's next_at to a random time in
	// [c/2, c], c = min(CompensationBackoffMax, BackoffBase·2^(n-1)):
	// exponential backoff with jitter, so a compensation that keeps failing
	// is tried less and less often, at least once per CompensationBackoffMax.
	// Execute waits for the next call itself only while that wait is at
	// most BackoffMax; past it, it returns an error with the saga still
	// Compensating, and RunDue calls the compensation again once next_at
	// has passed.
	// Default: 5m.
	CompensationBackoffMax time.Duration
	// PollInterval is how often Run looks for due sagas. Default: 1s.
	PollInterval time.Duration
	// Registerer receives the idem_saga_* metrics (see package metrics).
	// Default: nil, metrics are kept but not exported.
	Registerer prometheus.Registerer
	// Logger logs failing steps and compensations. Default: slog.Default().
	Logger *slog.Logger
}

// Defaults of Config.
const (
	defaultStepAttempts           = 3
	defaultCompensationAttempts   = 5
	defaultBackoffBase            = 100 * time.Millisecond
	defaultBackoffMax             = 10 * time.Second
	defaultCompensationBackoffMax = 5 * time.Minute
	defaultPollInterval           = time.Second
)

func (c Config) withDefaults() Config {
	if c.StepAttempts == 0 {
		c.StepAttempts = defaultStepAttempts
	}
	if c.CompensationAttempts == 0 {
		c.CompensationAttempts = defaultCompensationAttempts
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = defaultBackoffBase
	}
	if c.BackoffMax == 0 {
		c.BackoffMax = defaultBackoffMax
	}
	if c.CompensationBackoffMax == 0 {
		c.CompensationBackoffMax = defaultCompensationBackoffMax
	}
	if c.PollInterval == 0 {
		c.PollInterval = defaultPollInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate reports every problem of c (defaults applied) and of defs at
// once (errors.Join), each naming the field, its value and the rule
// ("saga: invalid configuration: …").
func (c Config) validate(defs []Definition) error {
	c = c.withDefaults()
	l := configerr.New(errInvalidConfig, "")
	if c.DB == nil {
		l.Bad("Config.DB", nil, "required")
	}
	if c.StepAttempts < 0 {
		l.Bad("Config.StepAttempts", c.StepAttempts, "must be >= 0 (0: the default)")
	}
	if c.CompensationAttempts < 0 {
		l.Bad("Config.CompensationAttempts", c.CompensationAttempts, "must be >= 0 (0: the default)")
	}
	if c.BackoffBase < 0 {
		l.Bad("Config.BackoffBase", c.BackoffBase, "must be >= 0 (0: the default)")
	}
	if c.BackoffMax < c.BackoffBase {
		l.Bad("Config.BackoffMax", c.BackoffMax, fmt.Sprintf("must not be less than BackoffBase (%v)", c.BackoffBase))
	}
	if c.CompensationBackoffMax < 0 {
		l.Bad("Config.CompensationBackoffMax", c.CompensationBackoffMax, "must be >= 0 (0: the default)")
	}
	if c.PollInterval < 0 {
		l.Bad("Config.PollInterval", c.PollInterval, "must be >= 0 (0: the default)")
	}
	if len(defs) == 0 {
		l.Bad("Definitions", 0, "no Definition given; at least one required")
	}
	types := map[string]bool{}
	for i, d := range defs {
		field := fmt.Sprintf("Definition[%s]", d.Type)
		switch {
		case d.Type == "":
			field = fmt.Sprintf("Definition[%d]", i)
			l.Bad(field+".Type", d.Type, "required")
		case types[d.Type]:
			l.Bad(field+".Type", d.Type, "given twice; each Definition needs its own Type")
		}
		types[d.Type] = true
		if len(d.Steps) == 0 {
			l.Bad(field+".Steps", 0, "at least one step required")
		}
		if d.Timeout < 0 {
			l.Bad(field+".Timeout", d.Timeout, "must be >= 0 (0: no deadline)")
		}
		names := map[string]bool{}
		for j, s := range d.Steps {
			step := fmt.Sprintf("%s.Steps[%d]", field, j)
			if s.Name == "" || names[s.Name] {
				l.Bad(step+".Name", s.Name, "required and unique within the Definition")
			}
			if s.Action == nil {
				l.Bad(step+".Action", nil, "required")
			}
			names[s.Name] = true
		}
	}
	return l.Err()
}

// Orchestrator drives sagas of the Definitions it was given. It keeps no
// state of its own between calls: any number of orchestrators, in one
// process or many, may drive the same sagas; each transition is made under
// the saga row's lock. It is safe for concurrent use.
type Orchestrator struct {
	cfg  Config
	defs map[string]*Definition
	// types are the keys of defs, sorted: RunDue's type filter.
	types []string
	m     *collectors
	// boundary, when set (tests), is called at every step boundary; an error
	// aborts Execute there as a crash would.
	boundary func(point string) error
}

// New returns an orchestrator for defs.
func New(cfg Config, defs ...Definition) (*Orchestrator, error) {
	if err := cfg.validate(defs); err != nil {
		return nil, err
	}
	m, err := newCollectors(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("saga: metrics: %w", err)
	}
	o := &Orchestrator{cfg: cfg.withDefaults(), defs: map[string]*Definition{}, m: m}
	for i := range defs {
		o.defs[defs[i].Type] = &defs[i]
	}
	o.types = slices.Sorted(maps.Keys(o.defs))
	return o, nil
}

// Start records a new saga of type typ with the given id and input, Running
// and due at once; call Execute (or let Run find it) to drive it. db may be
// the transaction of the handler that decided to start it (dedupe.Tx(ctx)),
// so the saga starts if and only if that handler's effects commit; a
// *pgxpool.Pool starts it on its own.
//
// The saga keeps ctx's correlation id (outbox.WithCorrelationID), or its
// own id when ctx has none, for every step and compensation (Call).
//
// The id is the saga's idempotency key: starting an id that exists is a
// no-op that returns created = false (a redelivered message starts its saga
// once). Starting it with another type is an error. The saga's entry into
// Running is counted (idem_saga_transitions_total) when the INSERT succeeds,
// even if db's transaction rolls back later.
func (o *Orchestrator) Start(ctx context.Context, db dedupe.DB, typ, id string, input []byte) (created bool, err error) {
	def, ok := o.defs[typ]
	if !ok {
		return false, fmt.Errorf("saga: start %s: unknown type %q", id, typ)
	}
	var deadline *time.Duration
	if def.Timeout > 0 {
		deadline = &def.Timeout
	}
	corr := correlation.From(ctx)
	if corr == "" {
		corr = id
	}
	tag, err := db.Exec(ctx, `INSERT INTO idem_saga (id, type, state, input, deadline, correlation_id)
		VALUES ($1, $2, 'running', $3, now() + $4::interval, $5) ON CONFLICT (id) DO NOTHING`, id, typ, input, deadline, corr)
	if err != nil {
		return false, fmt.Errorf("saga: start %s: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		o.m.Transitions.WithLabelValues(typ, string(Running)).Inc()
		return true, nil
	}
	var have string
	if err := db.QueryRow(ctx, `SELECT type FROM idem_saga WHERE id = $1`, id).Scan(&have); err != nil {
		return false, fmt.Errorf("saga: start %s: %w", id, err)
	}
	if have != typ {
		return false, fmt.Errorf("saga: start %s: exists with type %q, not %q", id, have, typ)
	}
	return false, nil
}

// Complete records the result of a pending step, typically from the idem
// handler that consumed the step's reply, in that handler's transaction
// tx: the reply's inbox row and the step's completion commit together. The
// saga becomes Running again and is picked up by the next RunDue (or an
// Execute). Completing a step already done is a no-op (a redelivered
// reply). A step that is not pending gives ErrNotPending: typically a late
// reply after the saga passed its deadline and compensated the step; the
// handler should then treat the reply as handled (errors.Is(err,
// saga.ErrNotPending) → return nil), not retry it.
func Complete(ctx context.Context, tx pgx.Tx, sagaID, step string, result []byte) error {
	return settle(ctx, tx, sagaID, step, "done", func(idx int) error {
		if _, err := tx.Exec(ctx, `UPDATE idem_saga_step SET state = 'done', result = $3, finished_at = now()
			WHERE saga_id = $1 AND idx = $2`, sagaID, idx, result); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE idem_saga SET state = 'running', step = $2 + 1, next_at = now(), updated_at = now()
			WHERE id = $1`, sagaID, idx)
		return err
	})
}

// Fail records that a pending step failed without effect (a negative
// reply); the saga compensates the steps before it. Like Complete it runs
// in the caller's transaction. Failing a step already failed is a no-op.
func Fail(ctx context.Context, tx pgx.Tx, sagaID, step, reason string) error {
	return settle(ctx, tx, sagaID, step, "failed", func(idx int) error {
		if _, err := tx.Exec(ctx, `UPDATE idem_saga_step SET state = 'failed', error = $3, finished_at = now()
			WHERE saga_id = $1 AND idx = $2`, sagaID, idx, reason); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE idem_saga SET state = 'compensating', step = $2 - 1, error = $3,
			next_at = now(), updated_at = now() WHERE id = $1`, sagaID, idx, step+": "+reason)
		return err
	})
}

// settle locks the saga row (the same lock order as Execute: saga, then
// step), checks the step is pending and applies update. A step already in
// state settled makes it a no-op.
func settle(ctx context.Context, tx pgx.Tx, sagaID, step, settled string, update func(idx int) error) error {
	var state State
	if err := tx.QueryRow(ctx, `SELECT state FROM idem_saga WHERE id = $1 FOR UPDATE`, sagaID).Scan(&state); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %q", ErrNotFound, sagaID)
		}
		return fmt.Errorf("saga: %s/%s: %w", sagaID, step, err)
	}
	var idx int
	var stepState string
	err := tx.QueryRow(ctx, `SELECT idx, state FROM idem_saga_step WHERE saga_id = $1 AND name = $2`, sagaID, step).Scan(&idx, &stepState)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s/%s was never started", ErrNotPending, sagaID, step)
	}
	if err != nil {
		return fmt.Errorf("saga: %s/%s: %w", sagaID, step, err)
	}
	if state != Waiting || stepState != "pending" {
		if stepState == settled {
			return nil // a redelivered reply
		}
		return fmt.Errorf("%w: %s/%s is %s (saga %s)", ErrNotPending, sagaID, step, stepState, state)
	}
	if err := update(idx); err != nil {
		return fmt.Errorf("saga: %s/%s: %w", sagaID, step, err)
	}
	return nil
}

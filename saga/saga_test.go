package saga_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/saga"
)

// idem.Migrate holds a dedupe.DB; a pool is what users pass.
var (
	_ saga.DB = dedupe.DB(nil)
	_ saga.DB = (*pgxpool.Pool)(nil)
)

// world is a schema with the saga tables and the effects of the test steps:
// local rows written through Call.Tx (primary key: a second write would
// fail), and "remote" rows written on their own connection, as another
// service would, deduplicated by the call's key; calls counts every call.
type world struct {
	t    *testing.T
	pool *pgxpool.Pool
	mu   sync.Mutex
	// failComp[key] is how many more times the compensation with that key
	// fails before it succeeds.
	failComp map[string]int
	// failAction[key] likewise for actions; -1: fail for good (Permanent).
	failAction map[string]int
}

func newWorld(t *testing.T) *world {
	t.Helper()
	pool := idemtest.ConnectPostgres(t).Pool // idem's tables, the saga tables among them
	ctx := t.Context()
	for range 2 { // idempotent on a migrated schema
		if err := tables.MigrateSaga(ctx, pool); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `
		CREATE TABLE local  (key text PRIMARY KEY);
		CREATE TABLE remote (key text PRIMARY KEY, seq bigserial);
		CREATE TABLE calls  (key text NOT NULL, seq bigserial);
		CREATE TABLE commands (key text PRIMARY KEY, payload bytea)`); err != nil {
		t.Fatal(err)
	}
	return &world{t: t, pool: pool, failComp: map[string]int{}, failAction: map[string]int{}}
}

// effect is what every test action and compensation does: a local write
// in the step's transaction and an idempotent remote call.
func (w *world) effect(ctx context.Context, c saga.Call) error {
	if _, err := c.Tx.Exec(ctx, `INSERT INTO local (key) VALUES ($1)`, c.Key); err != nil {
		return err
	}
	if _, err := w.pool.Exec(ctx, `INSERT INTO calls (key) VALUES ($1)`, c.Key); err != nil {
		return err
	}
	_, err := w.pool.Exec(ctx, `INSERT INTO remote (key) VALUES ($1) ON CONFLICT DO NOTHING`, c.Key)
	return err
}

// injected returns the failure to inject for key, if any.
func (w *world) injected(m map[string]int, key string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch n := m[key]; {
	case n < 0:
		return handler.Permanent(errors.New("declined"))
	case n > 0:
		m[key] = n - 1
		return errors.New("transient failure")
	}
	return nil
}

func (w *world) step(name string) saga.Step {
	return saga.Step{
		Name: name,
		Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
			if err := w.injected(w.failAction, c.Key); err != nil {
				return nil, err
			}
			if err := w.effect(ctx, c); err != nil {
				return nil, err
			}
			return []byte(name + "-result"), nil
		},
		Compensate: func(ctx context.Context, c saga.Call) error {
			if string(c.Results[name]) != name+"-result" && c.Step != "ship" {
				return fmt.Errorf("compensation of %s sees result %q", name, c.Results[name])
			}
			if err := w.injected(w.failComp, c.Key); err != nil {
				return err
			}
			return w.effect(ctx, c)
		},
	}
}

func (w *world) def() saga.Definition {
	return saga.Definition{Type: "order", Steps: []saga.Step{w.step("reserve"), w.step("charge"), w.step("ship")}}
}

func (w *world) orchestrator(reg prometheus.Registerer, defs ...saga.Definition) *saga.Orchestrator {
	w.t.Helper()
	if len(defs) == 0 {
		defs = []saga.Definition{w.def()}
	}
	o, err := saga.New(saga.Config{DB: w.pool, Registerer: reg, Logger: slog.New(slog.DiscardHandler), BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond}, defs...)
	if err != nil {
		w.t.Fatal(err)
	}
	return o
}

func (w *world) strings(sql string, args ...any) []string {
	w.t.Helper()
	rows, err := w.pool.Query(context.Background(), sql, args...)
	if err != nil {
		w.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		w.t.Fatal(err)
	}
	return out
}

// check asserts the effects of saga id: each of the keys exactly once,
// locally and remotely, remote ones in that order, and no other key.
func (w *world) check(id string, keys ...string) {
	w.t.Helper()
	var want []string
	for _, k := range keys {
		want = append(want, id+"/"+k)
	}
	local := w.strings(`SELECT key FROM local WHERE key LIKE $1 || '/%' ORDER BY key`, id)
	remote := w.strings(`SELECT key FROM remote WHERE key LIKE $1 || '/%' ORDER BY seq`, id)
	sorted := slices.Sorted(slices.Values(want))
	if !slices.Equal(local, sorted) || !slices.Equal(remote, want) {
		w.t.Fatalf("saga %s: local effects %v (want %v), remote effects in order %v (want %v)", id, local, sorted, remote, want)
	}
}

var errCrash = errors.New("simulated crash")

// Every boundary of a saga that completes, and of one whose last step fails
// and whose compensations fail once each before they succeed, is crashed
// at in turn; a fresh orchestrator then resumes the saga. It ends in the
// same state, with every effect exactly once and compensations in reverse
// order.
func TestCrashAtEveryBoundaryResumes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	for _, sc := range []struct {
		name  string
		fail  bool
		want  saga.State
		keys  []string
		steps []string // step states in order
	}{
		{"complete", false, saga.Completed, []string{"reserve", "charge", "ship"}, []string{"done", "done", "done"}},
		{"compensate", true, saga.Compensated,
			[]string{"reserve", "charge", "charge/compensate", "reserve/compensate"}, []string{"compensated", "compensated", "failed"}},
	} {
		total := -1
		for i := 0; ; i++ {
			id := fmt.Sprintf("%s-%d", sc.name, i)
			if sc.fail {
				w.failAction[id+"/ship"] = -1
				w.failComp[id+"/charge/compensate"] = 1
				w.failComp[id+"/reserve/compensate"] = 1
			}
			crasher := w.orchestrator(nil)
			hits := 0
			var crashedAt string
			saga.SetBoundary(crasher, func(point string) error {
				hits++
				if hits == i+1 {
					crashedAt = point
					return errCrash
				}
				return nil
			})
			if _, err := crasher.Start(ctx, w.pool, "order", id, []byte("input")); err != nil {
				t.Fatal(err)
			}
			st, err := crasher.Execute(ctx, id)
			if crashedAt == "" {
				if err != nil || st != sc.want {
					t.Fatalf("%s without crash: %s, %v", id, st, err)
				}
				total = i
				w.check(id, sc.keys...)
				break
			}
			if !errors.Is(err, errCrash) {
				t.Fatalf("%s: crash at %s: Execute returned %s, %v", id, crashedAt, st, err)
			}
			st, err = w.orchestrator(nil).Execute(ctx, id) // a fresh process resumes
			if err != nil || st != sc.want {
				t.Fatalf("%s: resumed after a crash at %s: %s, %v", id, crashedAt, st, err)
			}
			w.check(id, sc.keys...)
			status, err := saga.Get(ctx, w.pool, id)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range status.Steps {
				got = append(got, s.State)
			}
			if status.State != sc.want || !slices.Equal(got, sc.steps) {
				t.Fatalf("%s: status %+v, want %s with steps %v", id, status, sc.want, sc.steps)
			}
		}
		if total < 9 {
			t.Fatalf("%s: only %d boundaries", sc.name, total)
		}
		t.Logf("%s: crashed at each of %d boundaries", sc.name, total)
	}
}

func TestCompensationsRunInReverseOrderAndAreRetried(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	o := w.orchestrator(reg)
	id := "o-1"
	w.failAction[id+"/ship"] = -1
	w.failComp[id+"/charge/compensate"] = 3 // fails 3 times, then succeeds
	if _, err := o.Start(ctx, w.pool, "order", id, nil); err != nil {
		t.Fatal(err)
	}
	if created, err := o.Start(ctx, w.pool, "order", id, nil); err != nil || created {
		t.Fatalf("second Start: created %v, %v; want a no-op", created, err)
	}
	st, err := o.Execute(ctx, id)
	if err != nil || st != saga.Compensated {
		t.Fatalf("Execute: %s, %v", st, err)
	}
	w.check(id, "reserve", "charge", "charge/compensate", "reserve/compensate")
	status, err := saga.Get(ctx, w.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if status.Error != "ship: declined" || status.Steps[1].CompAttempts != 3 || status.Steps[2].Attempts != 1 {
		t.Fatalf("status %+v", status)
	}
	m := saga.Metrics(o)
	for _, c := range []struct {
		got, want float64
		what      string
	}{
		{testutil.ToFloat64(m.Compensations.WithLabelValues("order", "charge", "error")), 3, "charge compensation errors"},
		{testutil.ToFloat64(m.Compensations.WithLabelValues("order", "charge", "ok")), 1, "charge compensations"},
		{testutil.ToFloat64(m.Compensations.WithLabelValues("order", "reserve", "ok")), 1, "reserve compensations"},
		{testutil.ToFloat64(m.Transitions.WithLabelValues("order", "compensated")), 1, "compensated sagas"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "idem_saga_step_duration_seconds"); err != nil || n != 3 {
		t.Errorf("step duration series: %d, %v; want reserve and charge ok, ship error", n, err)
	}

	// A compensation that keeps failing leaves the saga compensating, with
	// ErrCompensationFailing, and RunDue picks it up again once it is due.
	id = "o-2"
	w.failAction[id+"/charge"] = -1
	w.failComp[id+"/reserve/compensate"] = saga.DefaultCompensationAttemptsForTest + 1
	if _, err := o.Start(ctx, w.pool, "order", id, nil); err != nil {
		t.Fatal(err)
	}
	if st, err := o.Execute(ctx, id); !errors.Is(err, saga.ErrCompensationFailing) || st != saga.Compensating {
		t.Fatalf("Execute with a failing compensation: %s, %v", st, err)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		if _, err := o.RunDue(ctx); err != nil {
			return err
		}
		if s, err := saga.Get(ctx, w.pool, id); err != nil || s.State != saga.Compensated {
			return fmt.Errorf("state %s, %v", s.State, err)
		}
		return nil
	})
	w.check(id, "reserve", "reserve/compensate")
}

func TestStepRetriesThenSucceeds(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	o := w.orchestrator(nil)
	w.failAction["r-1/charge"] = 2 // StepAttempts is 3
	if _, err := o.Start(ctx, w.pool, "order", "r-1", nil); err != nil {
		t.Fatal(err)
	}
	if st, err := o.Execute(ctx, "r-1"); err != nil || st != saga.Completed {
		t.Fatalf("Execute: %s, %v", st, err)
	}
	w.check("r-1", "reserve", "charge", "ship")
	s, _ := saga.Get(ctx, w.pool, "r-1")
	if s.Steps[1].Attempts != 3 || string(s.Steps[1].Result) != "charge-result" {
		t.Fatalf("charge step %+v", s.Steps[1])
	}
	if _, err := o.Execute(ctx, "nope"); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("Execute of an unknown saga: %v", err)
	}
	if _, err := saga.Get(ctx, w.pool, "nope"); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("Get of an unknown saga: %v", err)
	}
}

// The asynchronous path without Kafka: the "ship" step enqueues a command
// through Call.Tx and returns ErrPending; a reply handler calls Complete
// (or Fail) in its own transaction.
func TestPendingStepCompletedOrFailedByAReply(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	def := w.def()
	def.Steps[2].Action = func(ctx context.Context, c saga.Call) ([]byte, error) {
		if _, err := c.Tx.Exec(ctx, `INSERT INTO commands (key, payload) VALUES ($1, $2)`, c.Key, c.Input); err != nil {
			return nil, err
		}
		return nil, saga.ErrPending
	}
	o := w.orchestrator(nil, def)
	reply := func(f func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, w.pool, f)
	}
	for _, id := range []string{"ok", "declined"} {
		if _, err := o.Start(ctx, w.pool, "order", id, []byte(id)); err != nil {
			t.Fatal(err)
		}
		if st, err := o.Execute(ctx, id); err != nil || st != saga.Waiting {
			t.Fatalf("%s: Execute: %s, %v; want waiting", id, st, err)
		}
		if cmds := w.strings(`SELECT key FROM commands WHERE key = $1`, id+"/ship"); len(cmds) != 1 {
			t.Fatalf("%s: commands %v", id, cmds)
		}
		if st, err := o.Execute(ctx, id); err != nil || st != saga.Waiting { // nothing to do while waiting
			t.Fatalf("%s: Execute again: %s, %v", id, st, err)
		}
	}
	// "charge" is done: a (late, duplicate) Complete of it is a no-op, a Fail is refused.
	if err := reply(func(tx pgx.Tx) error { return saga.Complete(ctx, tx, "ok", "charge", nil) }); err != nil {
		t.Fatalf("Complete of a done step: %v, want a no-op", err)
	}
	if err := reply(func(tx pgx.Tx) error { return saga.Fail(ctx, tx, "ok", "charge", "x") }); !errors.Is(err, saga.ErrNotPending) {
		t.Fatalf("Fail of a done step: %v, want ErrNotPending", err)
	}
	for range 2 { // the reply is redelivered: the second Complete is a no-op
		if err := reply(func(tx pgx.Tx) error { return saga.Complete(ctx, tx, "ok", "ship", []byte("track-1")) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := reply(func(tx pgx.Tx) error { return saga.Fail(ctx, tx, "declined", "ship", "no carrier") }); err != nil {
		t.Fatal(err)
	}
	if n, err := o.RunDue(ctx); err != nil || n != 2 {
		t.Fatalf("RunDue: %d, %v", n, err)
	}
	ok, _ := saga.Get(ctx, w.pool, "ok")
	no, _ := saga.Get(ctx, w.pool, "declined")
	if ok.State != saga.Completed || string(ok.Steps[2].Result) != "track-1" || no.State != saga.Compensated || no.Error != "ship: no carrier" {
		t.Fatalf("after the replies: %+v / %+v", ok, no)
	}
	w.check("ok", "reserve", "charge")
	w.check("declined", "reserve", "charge", "charge/compensate", "reserve/compensate")
	if err := reply(func(tx pgx.Tx) error { return saga.Complete(ctx, tx, "nope", "ship", nil) }); !errors.Is(err, saga.ErrNotFound) {
		t.Fatalf("Complete of an unknown saga: %v", err)
	}
}

// A saga past its deadline compensates: a step blocked on its ctx, and a
// saga waiting for a reply that never comes (its pending step included).
func TestDeadline(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	blocked := w.def()
	// The blocked step waits for the deadline itself; 2 s leave room for
	// Start and the first step on a loaded machine (300 ms did not: the
	// deadline passed before the steps ran, and the saga compensated early).
	blocked.Type, blocked.Timeout = "blocked", 2*time.Second
	blocked.Steps[1].Action = func(ctx context.Context, c saga.Call) ([]byte, error) {
		<-ctx.Done() // the saga's deadline
		return nil, ctx.Err()
	}
	waiting := w.def()
	// The waiting saga must reach Waiting before its deadline, however slow
	// the machine: its deadline is an hour away, and the test moves it into
	// the past once the saga waits (under load a 300 ms deadline passed
	// before the pending step: "waiting: compensated").
	waiting.Type, waiting.Timeout = "waiting", time.Hour
	waiting.Steps[2].Action = func(context.Context, saga.Call) ([]byte, error) { return nil, saga.ErrPending }
	o := w.orchestrator(nil, blocked, waiting)
	if _, err := o.Start(ctx, w.pool, "blocked", "b", nil); err != nil {
		t.Fatal(err)
	}
	if st, err := o.Execute(ctx, "b"); err != nil || st != saga.Compensated {
		t.Fatalf("blocked: %s, %v", st, err)
	}
	w.check("b", "reserve", "reserve/compensate")
	if _, err := o.Start(ctx, w.pool, "waiting", "w", nil); err != nil {
		t.Fatal(err)
	}
	if st, err := o.Execute(ctx, "w"); err != nil || st != saga.Waiting {
		t.Fatalf("waiting: %s, %v", st, err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE idem_saga SET deadline = now() - interval '1 second' WHERE id = 'w'`); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		if _, err := o.RunDue(ctx); err != nil {
			return err
		}
		if s, _ := saga.Get(ctx, w.pool, "w"); s.State != saga.Compensated || s.Error != "deadline exceeded" {
			return fmt.Errorf("state %s (%s)", s.State, s.Error)
		}
		return nil
	})
	// the pending step is compensated too: its command may have been acted on
	w.check("w", "reserve", "charge", "ship/compensate", "charge/compensate", "reserve/compensate")
}

// A step whose dependency's breaker is open is an outage: not a failure,
// no attempt spent; the saga goes on once the breaker lets calls through.
func TestOpenBreakerIsAnOutage(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	b, err := breaker.NewSet(breaker.Settings{ConsecutiveFailures: 1, OpenTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	down := true
	def := w.def()
	charge := def.Steps[1].Action
	def.Steps[1].Action = func(ctx context.Context, c saga.Call) (res []byte, err error) {
		err = b.Do(ctx, "bank", func(ctx context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if down {
				return errors.New("bank unreachable")
			}
			res, err = charge(ctx, c)
			return err
		})
		return res, err
	}
	o := w.orchestrator(nil, def)
	if _, err := o.Start(ctx, w.pool, "order", "x", nil); err != nil {
		t.Fatal(err)
	}
	if st, err := o.Execute(ctx, "x"); !breaker.IsOpen(err) || st != saga.Running {
		t.Fatalf("Execute with the bank down: %s, %v; want running and an open breaker", st, err)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	idemtest.Eventually(t, 30*time.Second, func() error {
		if _, err := o.RunDue(ctx); err != nil && !breaker.IsOpen(err) {
			return err
		}
		if s, _ := saga.Get(ctx, w.pool, "x"); s.State != saga.Completed {
			return fmt.Errorf("state %s", s.State)
		}
		return nil
	})
	w.check("x", "reserve", "charge", "ship")
}

// The documented defaults are the ones New fills in.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	o, err := saga.New(saga.Config{DB: &pgxpool.Pool{}}, (&world{}).def())
	if err != nil {
		t.Fatal(err)
	}
	c := saga.ConfigOf(o)
	if c.StepAttempts != 3 || c.CompensationAttempts != 5 || c.BackoffBase != 100*time.Millisecond ||
		c.BackoffMax != 10*time.Second || c.CompensationBackoffMax != 5*time.Minute || c.PollInterval != time.Second || c.Logger == nil {
		t.Fatalf("defaults %+v", c)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	w := &world{}
	good := func() (saga.Config, []saga.Definition) {
		return saga.Config{DB: &pgxpool.Pool{}}, []saga.Definition{w.def()}
	}
	for name, mut := range map[string]func(*saga.Config, *[]saga.Definition){
		"DB":           func(c *saga.Config, _ *[]saga.Definition) { c.DB = nil },
		"StepAttempts": func(c *saga.Config, _ *[]saga.Definition) { c.StepAttempts = -1 },
		"BackoffMax": func(c *saga.Config, _ *[]saga.Definition) {
			c.BackoffBase, c.BackoffMax = time.Second, time.Millisecond
		},
		"no Definition": func(_ *saga.Config, d *[]saga.Definition) { *d = nil },
		"Type":          func(_ *saga.Config, d *[]saga.Definition) { *d = append(*d, w.def()) },
		"Steps":         func(_ *saga.Config, d *[]saga.Definition) { (*d)[0].Steps = nil },
		"Name":          func(_ *saga.Config, d *[]saga.Definition) { (*d)[0].Steps[1].Name = "reserve" },
	} {
		c, d := good()
		mut(&c, &d)
		if _, err := saga.New(c, d...); (err == nil || !strings.Contains(err.Error(), "saga: invalid configuration")) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want an invalid-configuration error naming it", name, err)
		}
	}
}

const childSchema = "IDEM_SAGA_SCHEMA"

// TestSagaChildProcess is not a test: TestSIGKILLMidStepResumes runs the
// test binary again with only this function (testenv.StartChild). It
// drives saga "k" whose "charge" step makes its remote effect, prints
// "at charge" and blocks, its transaction open, until the parent SIGKILLs
// it. Without the variable it returns at once.
func TestSagaChildProcess(t *testing.T) {
	if !testenv.InChild("TestSagaChildProcess") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a safety net
	defer cancel()
	pool := testenv.PoolOnSchema(t, os.Getenv(childSchema))
	w := &world{t: t, pool: pool, failComp: map[string]int{}, failAction: map[string]int{}}
	def := w.def()
	def.Steps[1].Action = func(ctx context.Context, c saga.Call) ([]byte, error) {
		if err := w.effect(ctx, c); err != nil {
			return nil, err
		}
		fmt.Println("at charge")
		<-ctx.Done()
		return nil, ctx.Err()
	}
	o := w.orchestrator(nil, def)
	if _, err := o.Start(ctx, pool, "order", "k", nil); err != nil {
		t.Fatal(err)
	}
	st, err := o.Execute(ctx, "k")
	t.Fatalf("child: Execute returned %s, %v before it was killed", st, err)
}

// An orchestrator process is SIGKILLed in the middle of a step, after the
// step's remote effect and before its commit. A fresh orchestrator runs the
// step again with the same key: the remote service applies it once (two
// calls, one effect), the local write once, and the saga completes.
func TestSIGKILLMidStepResumes(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	var schema string
	if err := w.pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		t.Fatal(err)
	}
	c := testenv.StartChild(t, "TestSagaChildProcess", childSchema+"="+schema)
	if !c.WaitForLine("at charge") {
		t.Fatalf("child: exited before the charge step; stderr:\n%s", c.Stderr())
	}
	c.Kill(t)
	if s, err := saga.Get(ctx, w.pool, "k"); err != nil || s.State != saga.Running || len(s.Steps) != 1 {
		t.Fatalf("after the kill: %+v, %v; want running with reserve done", s, err)
	}
	// The killed child's database session holds the saga's row lock until
	// PostgreSQL reads the closed connection and ends it, a moment after the
	// kill (longer on a loaded machine): until then Execute says ErrBusy,
	// as it would to any replica while another drives the saga.
	var st saga.State
	var err2 error
	idemtest.Eventually(t, 30*time.Second, func() error {
		st, err2 = w.orchestrator(nil).Execute(ctx, "k")
		if errors.Is(err2, saga.ErrBusy) {
			return err2
		}
		return nil
	})
	if err2 != nil || st != saga.Completed {
		t.Fatalf("resumed: %s, %v", st, err2)
	}
	w.check("k", "reserve", "charge", "ship")
	if calls := w.strings(`SELECT key FROM calls WHERE key = 'k/charge'`); len(calls) != 2 {
		t.Fatalf("charge called %d times, want 2 (killed once)", len(calls))
	}
}

// Three orchestrators drive the same 30 sagas at once, as replicas would:
// each saga ends once, every effect exactly once (a second local write of
// one key would fail its step and compensate the saga).
func TestConcurrentOrchestrators(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	const n = 30
	starter := w.orchestrator(nil)
	for i := range n {
		if _, err := starter.Start(ctx, w.pool, "order", fmt.Sprintf("c-%02d", i), nil); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		o := w.orchestrator(nil)
		wg.Go(func() {
			for {
				if _, err := o.RunDue(ctx); err != nil {
					errs[i] = err
					return
				}
				var left int
				if err := w.pool.QueryRow(ctx, `SELECT count(*) FROM idem_saga WHERE state NOT IN ('completed', 'compensated')`).Scan(&left); err != nil || left == 0 {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		w.check(fmt.Sprintf("c-%02d", i), "reserve", "charge", "ship")
	}
}

// TestRunDueSkipsTypesItHasNoDefinitionFor: 150 due sagas of a type this
// orchestrator does not define (another service's, or a retired type) are
// left alone, and its own saga, due later than all of them, runs at once.
func TestRunDueSkipsTypesItHasNoDefinitionFor(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	if _, err := w.pool.Exec(ctx, `INSERT INTO idem_saga (id, type, state, next_at)
		SELECT 'inv-' || i, 'invoice', 'running', now() - interval '1 hour' FROM generate_series(1, 150) i`); err != nil {
		t.Fatal(err)
	}
	o := w.orchestrator(nil)
	if _, err := o.Start(ctx, w.pool, "order", "o-1", nil); err != nil {
		t.Fatal(err)
	}
	n, err := o.RunDue(ctx)
	if err != nil || n != 1 {
		t.Fatalf("RunDue: drove %d sagas, err %v; want its own one saga and no error", n, err)
	}
	if s, err := saga.Get(ctx, w.pool, "o-1"); err != nil || s.State != saga.Completed {
		t.Fatalf("own saga: %s, %v; want completed", s.State, err)
	}
	if left := w.strings(`SELECT id FROM idem_saga WHERE type = 'invoice' AND (state <> 'running' OR next_at > now())`); len(left) != 0 {
		t.Fatalf("sagas of the other type were touched: %v", left)
	}
}

// TestCompensationBackoffGrows: a compensation that keeps failing is tried
// again after a delay that doubles with each failed call, across Execute
// calls (RunDue's), with jitter, up to CompensationBackoffMax. The delays are
// read from next_at − updated_at, both set by one statement.
func TestCompensationBackoffGrows(t *testing.T) {
	t.Parallel()
	w := newWorld(t)
	ctx := t.Context()
	const base, ceiling = 10 * time.Millisecond, 700 * time.Millisecond
	o, err := saga.New(saga.Config{DB: w.pool, Logger: slog.New(slog.DiscardHandler), CompensationAttempts: 1,
		BackoffBase: base, BackoffMax: base, CompensationBackoffMax: ceiling}, w.def())
	if err != nil {
		t.Fatal(err)
	}
	id := "o-1"
	w.failAction[id+"/charge"] = -1
	w.failComp[id+"/reserve/compensate"] = 1000
	if _, err := o.Start(ctx, w.pool, "order", id, nil); err != nil {
		t.Fatal(err)
	}
	var delays []time.Duration
	for n := 1; n <= 10; n++ {
		if st, err := o.Execute(ctx, id); !errors.Is(err, saga.ErrCompensationFailing) || st != saga.Compensating {
			t.Fatalf("Execute %d: %s, %v; want compensating, ErrCompensationFailing", n, st, err)
		}
		var secs float64
		if err := w.pool.QueryRow(ctx, `SELECT extract(epoch FROM next_at - updated_at)::float8 FROM idem_saga WHERE id = $1`, id).Scan(&secs); err != nil {
			t.Fatal(err)
		}
		d := time.Duration(secs * float64(time.Second))
		ceil := min(ceiling, base<<(n-1))
		if d < ceil/2-time.Millisecond || d > ceil+time.Millisecond {
			t.Fatalf("failed call %d: next try in %v, want within [%v, %v] (delays so far %v)", n, d, ceil/2, ceil, delays)
		}
		if len(delays) > 0 && d < delays[len(delays)-1]-time.Millisecond && ceil < ceiling {
			t.Fatalf("failed call %d: delay %v shorter than the one before (delays %v)", n, d, delays)
		}
		delays = append(delays, d)
	}
	if s, err := saga.Get(ctx, w.pool, id); err != nil || s.Steps[0].CompAttempts != 10 {
		t.Fatalf("status %+v, %v; want 10 failed compensation calls recorded", s, err)
	}
}

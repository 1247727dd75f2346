package saga_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/saga"
)

// TestCorrelationAcrossStepsAndCompensations: a saga started in a ctx with
// a correlation id gives it to every action and compensation, in Call and
// in their ctx, so the commands they enqueue carry it; Get shows it. A saga
// started without one takes its own id.
func TestCorrelationAcrossStepsAndCompensations(t *testing.T) {
	pool := idemtest.ConnectPostgres(t).Pool
	ctx := t.Context()
	var mu sync.Mutex
	seen := map[string][]string{} // saga id → "call/ctx" per action and compensation
	note := func(ctx context.Context, c saga.Call) {
		mu.Lock()
		defer mu.Unlock()
		seen[c.SagaID] = append(seen[c.SagaID], c.Key+"="+c.CorrelationID+"/"+outbox.CorrelationID(ctx))
	}
	o, err := saga.New(saga.Config{DB: pool, StepAttempts: 1}, saga.Definition{Type: "order", Steps: []saga.Step{
		{Name: "reserve",
			Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
				note(ctx, c)
				return nil, outbox.Enqueue(ctx, c.Tx, outbox.Message{Topic: "commands", Value: []byte(c.Key)})
			},
			Compensate: func(ctx context.Context, c saga.Call) error {
				note(ctx, c)
				return outbox.Enqueue(ctx, c.Tx, outbox.Message{Topic: "commands", Value: []byte(c.Key)})
			}},
		{Name: "charge", Action: func(ctx context.Context, c saga.Call) ([]byte, error) {
			note(ctx, c)
			return nil, handler.Permanent(fmt.Errorf("declined"))
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ id, corr, want string }{{"s1", "req-7", "req-7"}, {"s2", "", "s2"}} {
		if _, err := o.Start(outbox.WithCorrelationID(ctx, tc.corr), pool, "order", tc.id, nil); err != nil {
			t.Fatal(err)
		}
		if st, err := o.Execute(ctx, tc.id); err != nil || st != saga.Compensated {
			t.Fatalf("%s: Execute = (%v, %v), want Compensated", tc.id, st, err)
		}
		want := fmt.Sprintf("[%[1]s/reserve=%[2]s/%[2]s %[1]s/charge=%[2]s/%[2]s %[1]s/reserve/compensate=%[2]s/%[2]s]", tc.id, tc.want)
		if got := fmt.Sprint(seen[tc.id]); got != want {
			t.Errorf("%s: calls saw %s, want %s", tc.id, got, want)
		}
		st, err := saga.Get(ctx, pool, tc.id)
		if err != nil || st.CorrelationID != tc.want {
			t.Errorf("%s: Get = (%+v, %v), want correlation id %s", tc.id, st, err, tc.want)
		}
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE convert_from(value, 'UTF8') LIKE $1 || '/%'
			AND header_values[array_position(header_keys, 'idem-correlation-id')] = convert_to($2, 'UTF8')`, tc.id, tc.want).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 2 {
			t.Errorf("%s: %d commands carry correlation id %s, want 2 (the action's and the compensation's)", tc.id, n, tc.want)
		}
	}
}

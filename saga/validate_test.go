package saga_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/saga"
)

// TestNewReportsEveryProblem: New reports every bad field of Config and of
// the Definitions at once, each by name, every one an
// invalid-configuration error (consumer.Config's idiom).
func TestNewReportsEveryProblem(t *testing.T) {
	act := func(context.Context, saga.Call) ([]byte, error) { return nil, nil }
	_, err := saga.New(saga.Config{StepAttempts: -1, PollInterval: -1},
		saga.Definition{Type: "a", Steps: []saga.Step{{Name: "s", Action: act}, {Name: "s", Action: act}}},
		saga.Definition{Type: "b"})
	if err == nil || !strings.Contains(err.Error(), "saga: invalid configuration") {
		t.Fatalf("New = %v, want an invalid-configuration error", err)
	}
	for _, field := range []string{"Config.DB", "Config.StepAttempts", "Config.PollInterval", "Definition[a].Steps[1].Name", "Definition[b].Steps"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("New = %q, want it to name %s", err, field)
		}
	}
}

// TestNewZeroBackoffMaxTakesItsDefault: a Config that sets BackoffBase and
// leaves BackoffMax zero gets BackoffMax's default (10s), as the field's
// "Default:" line says; New validated the raw values and refused it.
func TestNewZeroBackoffMaxTakesItsDefault(t *testing.T) {
	act := func(context.Context, saga.Call) ([]byte, error) { return nil, nil }
	var pool *pgxpool.Pool // New does not use the database
	o, err := saga.New(saga.Config{DB: pool, BackoffBase: time.Second},
		saga.Definition{Type: "a", Steps: []saga.Step{{Name: "s", Action: act}}})
	if err != nil {
		t.Fatalf("New(BackoffBase 1s, BackoffMax 0) = %v, want BackoffMax to take its 10s default", err)
	}
	if c := saga.ConfigOf(o); c.BackoffBase != time.Second || c.BackoffMax != 10*time.Second {
		t.Fatalf("BackoffBase %v, BackoffMax %v; want 1s and the 10s default", c.BackoffBase, c.BackoffMax)
	}
}

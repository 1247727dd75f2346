package saga_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/internal/testing/docdefaults"
	"github.com/idemhq/idem/saga"
)

// TestDocumentedDefaults checks every "Default:" line of Config's field docs
// against the Config New runs with.
func TestDocumentedDefaults(t *testing.T) {
	o, err := saga.New(saga.Config{DB: &pgxpool.Pool{}}, (&world{}).def())
	if err != nil {
		t.Fatal(err)
	}
	if n := docdefaults.Check(t, ".", "Config", saga.ConfigOf(o)); n != 8 {
		t.Errorf("checked %d documented defaults of Config, want 8", n)
	}
}

package failidx

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/retrytopic"
)

// dead is one dead letter to seed.
type dead = failidxtest.Dead

// index stores ds with Insert, as the indexer would have read them at
// offsets from first on (for tests that need no Kafka).
func index(t *testing.T, pool *pgxpool.Pool, first int64, ds ...dead) {
	t.Helper()
	if err := Insert(testenv.Context(t), pool, failidxtest.Messages(first, ds...), 1<<20); err != nil {
		t.Fatal(err)
	}
}

// fingerprint is dlq.Record.Fingerprint of a record failing with kind,
// errorType and msg.
func fingerprint(kind handler.Kind, errorType, msg string) string {
	return (&dlq.Record{Failure: retrytopic.Failure{Kind: kind, ErrorType: errorType, Error: msg}}).Fingerprint()
}

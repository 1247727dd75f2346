package idemtest

import (
	"context"
	"os"
	"testing"

	idemschema "github.com/idemhq/idem/internal/schema"
	"github.com/idemhq/idem/internal/testing/testkit"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Postgres is a PostgreSQL schema of one test's own, holding idem's tables,
// made by [ConnectPostgres].
type Postgres struct {
	// Pool is a pool whose connections have Schema as their search_path:
	// idem's tables and every table the test creates without a schema
	// qualifier are there. It opens connections as they are needed, up to
	// pool_max_conns of DATABASE_URL.
	// Default: at most 16 connections (enough for a consumer with 16 lanes
	// and its sweeper). Closed when the test ends.
	Pool *pgxpool.Pool
	// Schema is the schema's name: the test's name made an identifier, then
	// "_" and a random suffix.
	Schema string
	// URL is DATABASE_URL with search_path set to Schema, for a second pool
	// (another consumer member) or a process the test starts. It keeps any
	// pool_* setting of DATABASE_URL, which pgxpool reads and pgx.Connect
	// would send to the server.
	URL string
}

// ConnectPostgres gives the test a database of its own on the PostgreSQL
// server at DATABASE_URL (as `make services` writes it): a new schema, with
// idem's tables created in it as idem.Migrate creates them (the inbox idem_processed,
// the ordering tables, the outbox, the saga and checkpoint tables, the
// failure index), and a pool on it. Tests that use it may run in parallel;
// none sees another's rows. When the test ends the pool is closed and the
// schema dropped with everything in it.
//
// DATABASE_URL must be set: there is no in-process PostgreSQL, so the test
// fails, naming the variable, when it is not. Pass Pool to [WithPostgres] to
// run a consumer on the transactional inbox.
func ConnectPostgres(tb testing.TB) *Postgres {
	tb.Helper()
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		tb.Fatalf("idemtest: DATABASE_URL is not set: start PostgreSQL (make services) and export DATABASE_URL (set -a; . .state/services.env; set +a)")
	}
	pool, schema, connURL := testkit.Schema(tb, base, 0)
	ctx, cancel := context.WithTimeout(context.Background(), defaultTimeout)
	defer cancel()
	if err := idemschema.Migrate(ctx, pool, nil, nil); err != nil {
		tb.Fatalf("idemtest: migrate schema %s: %v", schema, err)
	}
	return &Postgres{Pool: pool, Schema: schema, URL: connURL}
}

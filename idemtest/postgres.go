package idemtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	idemschema "github.com/idemhq/idem/internal/schema"

	"github.com/jackc/pgx/v5"
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
	// The schema is made and dropped on a connection of its own, from the
	// pool's parsed settings (pgx.Connect would send pool_max_conns to the
	// server as a parameter).
	baseCfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		tb.Fatalf("idemtest: DATABASE_URL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	schema := unique(tb.Name())
	quoted := pgx.Identifier{schema}.Sanitize()
	admin, err := pgx.ConnectConfig(ctx, baseCfg.ConnConfig.Copy())
	if err != nil {
		tb.Fatalf("idemtest: connect to DATABASE_URL: %v", err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+quoted); err != nil {
		tb.Fatalf("idemtest: create schema %s: %v", schema, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
		defer cancel()
		c, err := pgx.ConnectConfig(ctx, baseCfg.ConnConfig.Copy())
		if err != nil {
			tb.Errorf("idemtest: drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+quoted+" CASCADE"); err != nil {
			tb.Errorf("idemtest: drop schema %s: %v", schema, err)
		}
	})
	connURL, err := withSearchPath(base, schema)
	if err != nil {
		tb.Fatalf("idemtest: DATABASE_URL: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(connURL)
	if err != nil {
		tb.Fatalf("idemtest: DATABASE_URL: %v", err)
	}
	if !strings.Contains(connURL, "pool_max_conns") {
		cfg.MaxConns = 16
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("idemtest: pool on schema %s: %v", schema, err)
	}
	tb.Cleanup(pool.Close) // before the schema is dropped: cleanups run last-in first-out
	if err := idemschema.Migrate(ctx, pool, nil, nil); err != nil {
		tb.Fatalf("idemtest: migrate schema %s: %v", schema, err)
	}
	return &Postgres{Pool: pool, Schema: schema, URL: connURL}
}

// withSearchPath returns the connection string conn (a URL or keyword/value
// pairs) with search_path set to schema.
func withSearchPath(conn, schema string) (string, error) {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		u, err := url.Parse(conn)
		if err != nil {
			return "", err
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return fmt.Sprintf("%s search_path=%s", conn, schema), nil
}

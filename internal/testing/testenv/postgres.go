package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/idemhq/idem/internal/testing/testkit"
)

var (
	pgOnce sync.Once
	pgURL  string
	pgErr  error
)

// DatabaseURL returns the URL of the PostgreSQL server for tests: DATABASE_URL,
// else a testcontainers postgres container when Docker is healthy. It fails the
// test, naming the fix, when neither is available.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	SkipIfShort(tb)
	pgOnce.Do(func() {
		if u := os.Getenv("DATABASE_URL"); u != "" {
			pgURL = u
			return
		}
		if dockerHealthy() {
			ctx := context.Background()
			c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
				tcpostgres.WithDatabase("idem"), tcpostgres.WithUsername("idem"), tcpostgres.WithPassword("idem"),
				tcpostgres.BasicWaitStrategies())
			if err != nil {
				pgErr = fmt.Errorf("testenv: start postgres container: %w", err)
				return
			}
			pgURL, pgErr = c.ConnectionString(ctx, "sslmode=disable")
			return
		}
		pgErr = fmt.Errorf("testenv: no PostgreSQL: DATABASE_URL is not set and no Docker engine answers; run `make services` (or `make test`, which starts it) or set DATABASE_URL")
	})
	if pgErr != nil {
		tb.Fatal(pgErr)
	}
	return pgURL
}

// Postgres returns a pool whose connections use a fresh schema, unique to this
// test, as their search_path; the schema is dropped and the pool closed when the
// test ends. Tables created without a schema qualifier land in it. Unlike
// idemtest.ConnectPostgres (which also creates idem's tables) the schema is
// empty: tests of migrations and of the CLI's migrate start from nothing.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, _ := PostgresSchema(tb)
	return pool
}

// PostgresSchema is Postgres that also returns the schema's name. The pool
// holds at most 16 connections.
func PostgresSchema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	pool, schema, _ := testkit.Schema(tb, DatabaseURL(tb), 16)
	return pool, schema
}

// PoolOnSchema opens another pool (at most 4 connections) whose search_path is
// schema, for tests that need a second member on a schema Postgres made; it is
// closed when the test ends.
func PoolOnSchema(tb testing.TB, schema string) *pgxpool.Pool {
	tb.Helper()
	conn, err := testkit.WithSearchPath(DatabaseURL(tb), schema)
	if err != nil {
		tb.Fatalf("testenv: DATABASE_URL: %v", err)
	}
	return testkit.Pool(tb, conn, 4)
}

var (
	dockerOnce sync.Once
	dockerOK   bool
)

// dockerHealthy reports whether a Docker engine answers, without failing or
// skipping the test (the docker client alone is not enough).
func dockerHealthy() bool {
	dockerOnce.Do(func() {
		defer func() {
			if recover() != nil {
				dockerOK = false
			}
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		p, err := testcontainers.NewDockerProvider()
		if err != nil {
			return
		}
		defer p.Close()
		dockerOK = p.Health(ctx) == nil
	})
	return dockerOK
}

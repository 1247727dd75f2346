package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
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
// test ends. Tables created without a schema qualifier land in it.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, _ := PostgresSchema(tb)
	return pool
}

// PostgresSchema is Postgres that also returns the schema's name.
func PostgresSchema(tb testing.TB) (*pgxpool.Pool, string) {
	tb.Helper()
	url := DatabaseURL(tb)
	schema := Unique("t_" + tb.Name())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("testenv: connect to %s: %v (run `make services`?)", redact(url), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		tb.Fatalf("testenv: create schema: %v", err)
	}
	pool := newPool(tb, schema, 16)
	tb.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			tb.Logf("testenv: drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Logf("testenv: drop schema %s: %v", schema, err)
		}
	})
	return pool, schema
}

// PoolOnSchema opens another pool (at most 4 connections) whose search_path is
// schema, for tests that need a second member on a schema Postgres made; it is
// closed when the test ends.
func PoolOnSchema(tb testing.TB, schema string) *pgxpool.Pool {
	tb.Helper()
	pool := newPool(tb, schema, 4)
	tb.Cleanup(pool.Close)
	return pool
}

func newPool(tb testing.TB, schema string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(DatabaseURL(tb))
	if err != nil {
		tb.Fatalf("testenv: parse DATABASE_URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("testenv: pool: %v", err)
	}
	return pool
}

func redact(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "DATABASE_URL"
	}
	return fmt.Sprintf("postgres://%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
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

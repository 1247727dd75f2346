package testkit

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema creates a schema named Unique(tb.Name()) on the PostgreSQL server
// at base (a URL or keyword/value connection string) and returns a pool
// whose connections have it as their search_path, its name, and base with
// search_path set to it (for more pools or a child process). The pool holds
// at most maxConns connections; 0 means pool_max_conns of base, else 16.
// When the test ends the pool is closed and the schema dropped with
// everything in it.
func Schema(tb testing.TB, base string, maxConns int32) (*pgxpool.Pool, string, string) {
	tb.Helper()
	// The schema is made and dropped on a connection of its own, from the
	// pool's parsed settings (pgx.Connect would send pool_max_conns to the
	// server as a parameter).
	baseCfg, err := pgxpool.ParseConfig(base)
	if err != nil {
		tb.Fatalf("idemtest: DATABASE_URL: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := Unique(tb.Name())
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
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	connURL, err := WithSearchPath(base, schema)
	if err != nil {
		tb.Fatalf("idemtest: DATABASE_URL: %v", err)
	}
	if maxConns == 0 && !strings.Contains(connURL, "pool_max_conns") {
		maxConns = 16
	}
	pool := Pool(tb, connURL, maxConns) // closed before the schema is dropped: clean-ups run last-in first-out
	return pool, schema, connURL
}

// Pool opens a pool on conn holding at most maxConns connections (0: the
// pool_max_conns of conn, else pgxpool's default), closed when the test
// ends. Connections are opened as they are needed.
func Pool(tb testing.TB, conn string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(conn)
	if err != nil {
		tb.Fatalf("idemtest: DATABASE_URL: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatalf("idemtest: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// WithSearchPath returns the connection string conn (a URL or keyword/value
// pairs) with search_path set to schema.
func WithSearchPath(conn, schema string) (string, error) {
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

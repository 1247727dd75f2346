package dedupe_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/dedupe/dedupetest"
	"github.com/idemhq/idem/idemtest"
)

var (
	_ dedupe.DB = (*pgxpool.Pool)(nil)
	_ dedupe.DB = (*pgx.Conn)(nil)
)

func newPostgres(tb testing.TB, opts ...dedupe.PostgresOption) (*dedupe.Postgres, *pgxpool.Pool) {
	tb.Helper()
	pool := idemtest.ConnectPostgres(tb).Pool
	s := dedupe.NewPostgres(pool, opts...)
	if err := s.Migrate(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	return s, pool
}

func newLease(tb testing.TB, lease time.Duration, opts ...dedupe.PostgresOption) (*dedupe.PostgresLease, *pgxpool.Pool) {
	tb.Helper()
	pool := idemtest.ConnectPostgres(tb).Pool
	s := dedupe.NewPostgresLease(pool, lease, opts...)
	if err := s.Migrate(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	return s, pool
}

func TestMemoryConformance(t *testing.T) {
	dedupetest.Run(t, func(t *testing.T) dedupe.Store { return dedupe.NewMemory() })
}

func TestPostgresConformance(t *testing.T) {
	dedupetest.Run(t, func(t *testing.T) dedupe.Store {
		s, _ := newPostgres(t)
		return s
	})
}

func TestPostgresLeaseConformance(t *testing.T) {
	dedupetest.Run(t, func(t *testing.T) dedupe.Store {
		s, _ := newLease(t, 0)
		return s
	})
}

package dedupe

import (
	"context"
	"time"
)

// SweeperWithDefaults exposes Sweeper.withDefaults to the external tests.
func SweeperWithDefaults(s Sweeper) Sweeper { return s.withDefaults() }

// DefaultLeaseForTest is the lease NewPostgresLease takes when given 0.
const DefaultLeaseForTest = defaultLease

// DefaultTable is the inbox table used when WithTable is not given.
const DefaultTable = defaultTable

// The unexported errors, for the external tests.
var (
	ErrNoTx      = errNoTx
	ErrLeaseLost = errLeaseLost
	ErrTxAborted = errTxAborted
)

// SetClock makes the store write processed_at = now() for the rows it
// inserts on the key-lock path, instead of the transaction's now(): the
// tests put rows in the partition of their choice.
func SetClock(s Store, now func() time.Time) {
	switch s := s.(type) {
	case *Postgres:
		s.at = now
	case *PostgresLease:
		s.at = now
	}
}

// PartitionAt converts the store's table as Migrate does with
// WithPartitions, choosing the first partition's start as if the database's
// clock read at: with at in the past, the test gets partitions in the past.
func PartitionAt(ctx context.Context, s *Postgres, at time.Time) error {
	if err := s.table.migratePlain(ctx, s.db); err != nil {
		return err
	}
	return s.table.partition(ctx, s.db, at)
}

// BoundaryAfter is boundaryAfter.
func BoundaryAfter(t time.Time, every time.Duration) time.Time { return boundaryAfter(t, every) }

// KeyLock is keyLock.
func KeyLock(group, key string) int64 { return keyLock(group, key) }

package index

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what the index needs from a database handle: *pgxpool.Pool satisfies
// it (and so does a pgx.Tx for Migrate).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var _ DB = (*pgxpool.Pool)(nil)

// Store reads the index and writes its audit table. It is safe for
// concurrent use.
type Store struct {
	db DB
}

// NewStore returns a Store on pool (whose search_path must reach the tables
// Migrate created).
func NewStore(pool *pgxpool.Pool) *Store { return &Store{db: pool} }

// newStore is NewStore on any DB (a transaction in tests).
func newStore(db DB) *Store { return &Store{db: db} }

// Overview returns one TopicSummary per group and DLQ topic that has records,
// ordered by group and topic.
func (s *Store) Overview(ctx context.Context) ([]TopicSummary, error) {
	return nil, errors.New("index: not implemented")
}

// Groups returns the failure groups of the records f matches, largest first.
func (s *Store) Groups(ctx context.Context, f Filter) ([]FailureGroup, error) {
	return nil, errors.New("index: not implemented")
}

// List returns up to limit records matching f, latest failure first
// (LastFailureAt, then ID, descending), starting after cursor ("" for the
// first page). limit <= 0 means 50; it is capped at 1000. Values and headers
// are filled; Versions are not.
func (s *Store) List(ctx context.Context, f Filter, cursor string, limit int) (Page, error) {
	return Page{}, errors.New("index: not implemented")
}

// Get returns record id with its Versions; an error wrapping ErrNotFound when
// the index has no such record.
func (s *Store) Get(ctx context.Context, id int64) (Record, error) {
	return Record{}, errors.New("index: not implemented")
}

// Audit returns up to limit audit entries, newest first, starting after
// cursor ("" for the first page), and the cursor of the next page ("" on the
// last page). limit <= 0 means 50.
func (s *Store) Audit(ctx context.Context, cursor string, limit int) ([]AuditEntry, string, error) {
	return nil, "", errors.New("index: not implemented")
}

// WriteAudit appends e to the audit table (e.ID is ignored; e.At defaults to
// now). The console uses it for actions of its own, such as revealing a
// masked payload.
func (s *Store) WriteAudit(ctx context.Context, e AuditEntry) error {
	return errors.New("index: not implemented")
}

// Sweep deletes resolved, replayed and archived records whose status changed
// more than olderThan ago (with their versions), in batches, and returns how
// many it deleted. Unresolved records are never swept. Audit rows are kept.
// Indexer.Run calls it every hour with Indexer.Retention.
func (s *Store) Sweep(ctx context.Context, olderThan time.Duration) (int64, error) {
	return 0, errors.New("index: not implemented")
}

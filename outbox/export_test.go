package outbox

import (
	"context"
	"time"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/outboxstore"
)

// SetAfterAck installs a hook the relay calls after a round's acks and before
// it deletes the acked rows (the crash test stops the process there).
func SetAfterAck(r *Relay, f func(ids []int64)) { r.afterAck = f }

// SetIdle installs a hook the relay calls each time it is about to wait idle,
// with the longest it will wait.
func SetIdle(r *Relay, f func(wait time.Duration)) { r.idle = f }

// SetAfterCommit installs a hook the exactly-once relay calls after CommitTxn
// returned err and before it deletes the round's rows.
func SetAfterCommit(r *Relay, f func(round int64, err error)) { r.afterCommit = f }

// SetBeforeCommit installs a hook the exactly-once relay calls before
// CommitTxn; an error aborts the round.
func SetBeforeCommit(r *Relay, f func(round int64) error) { r.beforeCommit = f }

// DefaultTransactionalID is the transactional id an exactly-once relay of
// table derives when Relay.TransactionalID is empty.
func DefaultTransactionalID(ctx context.Context, db dedupe.DB, table string) (string, error) {
	t, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return defaultTransactionalID(ctx, db, t)
}

// FetchSQL is the statement a round reads its window with, on table, with
// the batch size as $1.
func FetchSQL(table string) (string, error) {
	t, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return t.fetchSQL(), nil
}

// StatsSQL is the statement the leader refreshes its gauges with, on table.
func StatsSQL(table string) (string, error) {
	t, err := parseTable(table)
	if err != nil {
		return "", err
	}
	return t.statsSQL(), nil
}

// Reason is failureReason, for the external tests.
func Reason(err error) string { return failureReason(err) }

// Rejected is rejected, for the external tests.
func Rejected(err error) bool { return rejected(err) }

// Reading and retrying rows live in internal/outboxstore (the CLI's and the
// console's); the external tests reach them under their old names.
type (
	Row         = outboxstore.Row
	ListOptions = outboxstore.ListOptions
)

var (
	List  = outboxstore.List
	Retry = outboxstore.Retry
)

// Row states, as outboxstore names them.
const (
	StatePending   = outboxstore.StatePending
	StatePublished = outboxstore.StatePublished
	StateFailed    = outboxstore.StateFailed
)

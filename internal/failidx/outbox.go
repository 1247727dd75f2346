package failidx

import (
	"context"
	"fmt"

	"github.com/idemhq/idem/internal/outboxstore"
)

// FailedOutbox returns up to limit outbox rows (idem_outbox) in the failed
// state, lowest id first (none when the table does not exist). limit <= 0
// means 100.
func (a *Actions) FailedOutbox(ctx context.Context, limit int) ([]OutboxRow, error) {
	rows, err := outboxstore.List(ctx, a.store.db, outboxstore.ListOptions{State: outboxstore.StateFailed, Limit: limit})
	if isUndefinedTable(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("index: failed outbox rows: %w", err)
	}
	out := make([]OutboxRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, OutboxRow{ID: r.ID, Topic: r.Topic, Key: string(r.Key), Error: r.LastError, Attempts: r.Attempts, CreatedAt: r.CreatedAt})
	}
	return out, nil
}

// RetryOutbox makes the failed outbox rows ids pending again:
// the relay publishes them again. Rows that are not failed are skipped.
func (a *Actions) RetryOutbox(ctx context.Context, actor string, ids []int64, reason string) (Result, error) {
	res := Result{Matched: len(ids)}
	if err := checkActor(actor); err != nil {
		return Result{}, err
	}
	if len(ids) == 0 {
		return Result{}, invalid("ids", "empty: give the outbox rows to retry")
	}
	done, err := outboxstore.Retry(ctx, a.store.db, "", ids...)
	res.Done = len(done)
	res.Skipped = res.Matched - res.Done
	return res, a.audit(ctx, actor, "retry-outbox", ids, "outbox rows", reason, res, err, "retried")
}

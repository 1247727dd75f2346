package failidx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Audit returns up to limit audit entries, newest first, starting after
// cursor ("" for the first page), and the cursor of the next page ("" on the
// last page). limit <= 0 means 50; it is capped at 1000.
func (s *Store) Audit(ctx context.Context, cursor string, limit int) ([]AuditEntry, string, error) {
	limit, before, err := pageArgs(cursor, limit)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.Query(ctx, `SELECT id, at, actor, action, record_ids, detail, reason, result
		FROM idem_dlq_audit WHERE id < $1 ORDER BY id DESC LIMIT $2`, before, limit+1)
	if err != nil {
		return nil, "", fmt.Errorf("index: audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AuditEntry, error) {
		var e AuditEntry
		err := row.Scan(&e.ID, &e.At, &e.Actor, &e.Action, &e.RecordIDs, &e.Detail, &e.Reason, &e.Result)
		return e, err
	})
	if err != nil {
		return nil, "", fmt.Errorf("index: audit: %w", err)
	}
	out, next := nextPage(out, limit, func(e AuditEntry) int64 { return e.ID })
	return out, next, nil
}

// WriteAudit appends e to the audit table (e.ID is ignored; a zero e.At
// means now). The console uses it for actions of its own, such as revealing
// a masked payload. Actor and Action are required.
func (s *Store) WriteAudit(ctx context.Context, e AuditEntry) error {
	return writeAudit(ctx, s.db, e)
}

// WriteAuditTx is WriteAudit in tx: the row commits with what tx does,
// or not at all (the live controls audit their changes this way).
func WriteAuditTx(ctx context.Context, tx pgx.Tx, e AuditEntry) error {
	return writeAudit(ctx, tx, e)
}

func writeAudit(ctx context.Context, db querier, e AuditEntry) error {
	if db == nil {
		return errors.New("index: write audit: no database")
	}
	if strings.TrimSpace(e.Actor) == "" {
		return invalid("actor", "empty: every action is audited under a name")
	}
	if e.Action == "" {
		return invalid("action", "empty")
	}
	var at *time.Time
	if !e.At.IsZero() {
		at = &e.At
	}
	ids := e.RecordIDs
	if ids == nil {
		ids = []int64{}
	}
	_, err := db.Exec(ctx, `INSERT INTO idem_dlq_audit (at, actor, action, record_ids, detail, reason, result)
		VALUES (coalesce($1, now()), $2, $3, $4, $5, $6, $7)`,
		at, clean(e.Actor), clean(e.Action), ids, clean(e.Detail), clean(e.Reason), clean(e.Result))
	if err != nil {
		return fmt.Errorf("index: write audit: %w", err)
	}
	return nil
}

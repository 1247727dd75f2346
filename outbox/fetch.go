package outbox

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
)

// This file reads a round's window of pending rows: the heads of each key
// (Relay's doc, "Publishing" and "Delayed rows").

// fetchSQL reads a window of up to $1 publishable pending rows in id order
// (rows whose retry time, if any, has come, and that no earlier waiting row
// of their key holds back) and returns, values included, only each key's
// first row of the window and every keyless row, with whether the row was
// waiting (had a retry_at) and the window's size. The window is the lowest
// ids of two ranges, each read in the order of its own index so that
// neither walks past rows it does not want: rows with no retry_at in id
// order (most rows), and rows whose retry_at has come in time order (rows
// scheduled for later are never visited, nor is the backlog of undelayed
// rows). Taking the second range in time order rather than id order may
// leave a due row out of a window that holds a later id; per-key order
// still holds because a waiting row, due or not, holds back every later row
// of its key until it is published (%[2]s). A delayed row never holds back
// the rows enqueued before it.
const fetchSQL = `
WITH w AS (
  SELECT id, key, row_number() OVER (PARTITION BY key ORDER BY id) AS nth
  FROM (
    SELECT id, key FROM (
      (SELECT id, key FROM %[1]s o
       WHERE state = 'pending' AND retry_at IS NULL AND %[2]s
       ORDER BY id LIMIT $1)
      UNION ALL
      (SELECT id, key FROM %[1]s o
       WHERE state = 'pending' AND retry_at IS NOT NULL AND retry_at <= now() AND %[2]s
       ORDER BY retry_at LIMIT $1)) ranges
    ORDER BY id
    LIMIT $1) window_rows
)
SELECT o.id, o.event_id::text, o.topic, o.key, o.value, o.header_keys, o.header_values, o.attempts, o.rejections,
       greatest(o.created_at, o.not_before), o.retry_at IS NOT NULL, (SELECT count(*) FROM w), o.key_id, o.sealed
FROM %[1]s o JOIN w ON w.id = o.id
WHERE w.nth = 1 OR w.key IS NULL
ORDER BY o.id`

// notHeldSQL is true for a row o of the table %[1]s that no earlier pending
// row of its key holds back: one that waits (has a retry_at: its NotBefore,
// or its retry after a failed publish), due or not. One probe of the held
// index, which holds only waiting rows.
const notHeldSQL = `(o.key IS NULL OR NOT EXISTS (
  SELECT 1 FROM %[1]s h
  WHERE h.state = 'pending' AND h.retry_at IS NOT NULL AND h.key = o.key AND h.id < o.id))`

// fetchSQL is fetchSQL for table t.
func (t table) fetchSQL() string {
	return fmt.Sprintf(fetchSQL, t.quoted, fmt.Sprintf(notHeldSQL, t.quoted))
}

// fetch returns the heads of the next window (see fetchSQL) in id order.
// more says another round may find work at once: the window was full, or
// it held rows behind their key's head, or a head was a waiting row, whose
// key's later rows it kept out of the window.
func (s *session) fetch(ctx context.Context, conn *pgx.Conn) (heads []row, more bool, err error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	rs, err := conn.Query(qctx, s.t.fetchSQL(), s.cfg.BatchSize)
	if err != nil {
		return nil, false, fmt.Errorf("outbox: read %s: %w", s.t.quoted, err)
	}
	var window int
	heads, err = pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.id, &x.eventID, &x.topic, &x.key, &x.value, &x.hkeys, &x.hvals, &x.attempts, &x.rejects, &x.due, &x.waited, &window,
			&x.keyID, &x.sealed)
		return x, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("outbox: read %s: %w", s.t.quoted, err)
	}
	more = window == s.cfg.BatchSize || len(heads) < window || slices.ContainsFunc(heads, func(r row) bool { return r.waited })
	return heads, more, nil
}

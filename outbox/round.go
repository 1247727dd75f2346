package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/internal/pglead"
)

// This file is the leader's loop: rounds of fetch, publish and settle,
// the idle wait for a NOTIFY, the gauges and the sweep of published rows.

// lead publishes until the connection fails (error) or ctx ends (nil).
func (s *session) lead(ctx context.Context, conn *pgx.Conn) error {
	round := s.round
	if s.txn != nil {
		defer s.closeTxnProducer()
		if err := s.txnRecover(ctx, conn); err != nil || ctx.Err() != nil {
			return err
		}
		round = s.txnRound
	}
	var nextStats time.Time
	nextSweep := time.Now()
	for {
		more, err := round(ctx, conn)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		if now := time.Now(); !now.Before(nextStats) {
			if err := s.stats(ctx, conn); err != nil {
				return err
			}
			nextStats = now.Add(s.cfg.StatsInterval)
		}
		if now := time.Now(); s.cfg.KeepPublished > 0 && !now.Before(nextSweep) {
			if err := s.sweep(ctx, conn); err != nil {
				return err
			}
			nextSweep = now.Add(s.cfg.SweepInterval)
		}
		if more {
			continue
		}
		wait, err := s.idleWait(ctx, conn)
		if err != nil {
			return err
		}
		if s.cfg.idle != nil {
			s.cfg.idle(wait)
		}
		if err := pglead.Wait(ctx, conn, wait); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("outbox: %w", err)
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// idleWait is how long the leader may wait for a NOTIFY: PollInterval, or
// less when a waiting row (a NotBefore, a failed row's retry) comes due
// sooner. A row that is due but held back by an earlier waiting row of its
// key does not count (its holder's time does), or the leader would spin
// until the holder is due. The retry index is read in time order and the
// walk stops at the first row not held back.
func (s *session) idleWait(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	var next *float64
	err := s.query(ctx, conn, `SELECT extract(epoch FROM o.retry_at - now())::float8 FROM `+s.t.quoted+` o
		WHERE o.state = 'pending' AND o.retry_at IS NOT NULL AND `+fmt.Sprintf(notHeldSQL, s.t.quoted)+`
		ORDER BY o.retry_at LIMIT 1`).Scan(&next)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("outbox: next retry: %w", err)
	}
	return pglead.Until(next, s.cfg.PollInterval), nil
}

// row is one pending outbox row.
type row struct {
	id       int64
	eventID  string
	topic    string
	key      []byte
	value    []byte
	hkeys    []string
	hvals    [][]byte
	attempts int
	rejects  int
	due      time.Time // created_at, or not_before when later
	waited   bool      // it had a retry_at (a NotBefore, a retry)
	keyID    *int64    // the data key of sealed; nil: value and headers in clear
	sealed   []byte    // value and headers sealed at rest (Relay.Enqueue)
}

// round publishes the heads of the first BatchSize publishable rows. more
// says another round may find work at once.
func (s *session) round(ctx context.Context, conn *pgx.Conn) (more bool, err error) {
	heads, more, err := s.fetch(ctx, conn)
	if err != nil || len(heads) == 0 {
		return false, err
	}
	if heads, err = s.openHeads(ctx, conn, heads); err != nil || len(heads) == 0 {
		return more, err
	}
	errs := s.publish(heads)

	var acked []int64
	for i, h := range heads {
		if errs[i] == nil {
			acked = append(acked, h.id)
			s.m.PublishSeconds.WithLabelValues(s.t.name).Observe(max(0, time.Since(h.due).Seconds()))
		}
	}
	failed := s.failures(heads, errs)
	if s.cfg.afterAck != nil {
		s.cfg.afterAck(acked)
	}
	// Kafka has the acked rows: record it even if ctx was cancelled meanwhile,
	// or a clean shutdown would publish them again.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.QueryTimeout)
	defer cancel()
	if err := s.settle(actx, conn, acked, failed); err != nil {
		return false, err
	}
	s.m.Published.WithLabelValues(s.t.name).Add(float64(len(acked)))
	return more, nil
}

// settle removes (or marks published) the acked rows and records the
// failures, in one implicit transaction.
func (s *session) settle(ctx context.Context, conn *pgx.Conn, acked []int64, failed []failure) error {
	b := &pgx.Batch{}
	if len(acked) > 0 {
		if s.cfg.KeepPublished > 0 {
			b.Queue("UPDATE "+s.t.quoted+" SET state = 'published', published_at = now(), retry_at = NULL WHERE id = ANY($1) AND state = 'pending'", acked)
		} else {
			b.Queue("DELETE FROM "+s.t.quoted+" WHERE id = ANY($1) AND state = 'pending'", acked)
		}
	}
	for _, f := range failed {
		b.Queue(`UPDATE `+s.t.quoted+` SET attempts = attempts + 1, last_error = $2,
			rejections = rejections + CASE WHEN $5 THEN 1 ELSE 0 END,
			retry_at = now() + make_interval(secs => $3),
			state = CASE WHEN $4 THEN 'failed' ELSE 'pending' END
			WHERE id = $1 AND state = 'pending'`, f.id, f.err, f.wait.Seconds(), f.final, f.rejected)
	}
	if b.Len() == 0 {
		return nil
	}
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("outbox: record published rows: %w", err)
	}
	return nil
}

// statsSQL counts the pending and failed rows of the table %[1]s and gives
// the seconds since the oldest pending row could first be published: its
// insert, or its NotBefore when later. Rows whose NotBefore has not come
// are left out, and so are the rows an earlier waiting row of their key
// holds back (hk.first is the key's first waiting row): such a row waits by
// design; once its holder is due the holder counts itself, and a held row
// has never waited longer than its holder. One pass over the table, joined
// to the keys of the waiting rows (read from the retry index, usually few).
const statsSQL = `SELECT count(*) FILTER (WHERE o.state = 'pending'), count(*) FILTER (WHERE o.state = 'failed'),
  coalesce(extract(epoch FROM now() - min(greatest(o.created_at, o.not_before))
    FILTER (WHERE o.state = 'pending' AND (o.not_before IS NULL OR o.not_before <= now())
            AND (hk.first IS NULL OR hk.first >= o.id))), 0)::float8
FROM %[1]s o LEFT JOIN (
  SELECT key, min(id) AS first FROM %[1]s
  WHERE state = 'pending' AND retry_at IS NOT NULL AND key IS NOT NULL GROUP BY key) hk ON hk.key = o.key
WHERE o.state <> 'published'`

// statsSQL is statsSQL for table t.
func (t table) statsSQL() string { return fmt.Sprintf(statsSQL, t.quoted) }

// stats refreshes the pending, oldest-pending and failed gauges.
func (s *session) stats(ctx context.Context, conn *pgx.Conn) error {
	var pending, failed int64
	var oldest float64
	err := s.query(ctx, conn, s.t.statsSQL()).Scan(&pending, &failed, &oldest)
	if err != nil {
		return fmt.Errorf("outbox: stats: %w", err)
	}
	s.m.Pending.WithLabelValues(s.t.name).Set(float64(pending))
	s.m.Failed.WithLabelValues(s.t.name).Set(float64(failed))
	s.m.OldestPending.WithLabelValues(s.t.name).Set(max(0, oldest))
	return nil
}

// sweep deletes published rows older than KeepPublished, 1,000 at a time.
func (s *session) sweep(ctx context.Context, conn *pgx.Conn) error {
	for {
		tag, err := s.exec(ctx, conn, `DELETE FROM `+s.t.quoted+` WHERE id IN (
			SELECT id FROM `+s.t.quoted+` WHERE state = 'published' AND published_at < now() - make_interval(secs => $1) LIMIT 1000)`,
			s.cfg.KeepPublished.Seconds())
		if err != nil {
			return fmt.Errorf("outbox: sweep published rows: %w", err)
		}
		if tag.RowsAffected() < 1000 || ctx.Err() != nil {
			return nil
		}
	}
}

func (s *session) query(ctx context.Context, conn *pgx.Conn, sql string, args ...any) pgx.Row {
	return pglead.QueryRow(ctx, conn, s.cfg.QueryTimeout, sql, args...)
}

func (s *session) exec(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (interface{ RowsAffected() int64 }, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	return conn.Exec(qctx, sql, args...)
}

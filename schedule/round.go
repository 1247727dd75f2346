package schedule

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/forward"
	"github.com/idemhq/idem/internal/pglead"
	"github.com/idemhq/idem/internal/seal"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// lead publishes due rows until the connection fails or ctx ends.
func (r *runner) lead(ctx context.Context, conn *pgx.Conn) error {
	var nextStats time.Time
	for {
		if now := time.Now(); !now.Before(nextStats) {
			if err := r.stats(ctx, conn); err != nil {
				return ctxOr(ctx, err)
			}
			nextStats = now.Add(r.cfg.StatsInterval)
		}
		n, err := r.round(ctx, conn)
		if err != nil {
			return ctxOr(ctx, err)
		}
		if n == r.cfg.BatchSize {
			continue // more may be due
		}
		wait, err := r.idleWait(ctx, conn)
		if err != nil {
			return ctxOr(ctx, err)
		}
		if err := pglead.Wait(ctx, conn, min(wait, time.Until(nextStats))); err != nil {
			return ctxOr(ctx, fmt.Errorf("schedule: %w", err))
		}
		if ctx.Err() != nil {
			return nil
		}
	}
}

// ctxOr is nil when ctx has ended (the error is the cancellation's), else err.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// idleWait is how long until the group's next row is due, at most MaxWait.
func (r *runner) idleWait(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	var next *float64
	err := r.row(ctx, conn, `SELECT extract(epoch FROM min(due_at) - now())::float8 FROM `+table+
		` WHERE consumer_group = $1`, r.cfg.Group).Scan(&next)
	if err != nil {
		return 0, fmt.Errorf("schedule: next due time: %w", err)
	}
	return pglead.Until(next, r.cfg.MaxWait), nil
}

// due is one row to publish.
type due struct {
	id       int64
	rec      forward.Record
	attempts int
	// keyID and sealed are the row's payload sealed at rest (nil keyID:
	// in clear); dlq, ikey and origin say where its stub goes when the
	// payload cannot be opened for good.
	keyID  *int64
	sealed []byte
	dlq    string
	ikey   string
	origin handler.Origin
	// stub is why rec is the dead-letter stub of the row (nil: the row).
	stub error
}

// round publishes up to BatchSize due rows and settles them; it returns how
// many rows it read.
func (r *runner) round(ctx context.Context, conn *pgx.Conn) (int, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := conn.Query(qctx, `SELECT id, topic, partition, key, value, header_keys, header_values, record_timestamp, attempts,
			key_id, sealed, dlq_topic, idempotency_key, origin_topic, origin_partition, origin_offset
		FROM `+table+` WHERE consumer_group = $1 AND due_at <= now() ORDER BY due_at, id LIMIT $2`, r.cfg.Group, r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("schedule: read due rows: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (due, error) {
		var d due
		var hk []string
		var hv [][]byte
		var ts *time.Time
		if err := row.Scan(&d.id, &d.rec.Topic, &d.rec.Partition, &d.rec.Key, &d.rec.Value, &hk, &hv, &ts, &d.attempts,
			&d.keyID, &d.sealed, &d.dlq, &d.ikey, &d.origin.Topic, &d.origin.Partition, &d.origin.Offset); err != nil {
			return d, err
		}
		for i, k := range hk {
			d.rec.Headers = append(d.rec.Headers, sarama.RecordHeader{Key: []byte(k), Value: hv[i]})
		}
		if ts != nil {
			d.rec.Timestamp = *ts
		}
		return d, nil
	})
	if err != nil || len(batch) == 0 {
		if err != nil {
			err = fmt.Errorf("schedule: read due rows: %w", err)
		}
		return 0, err
	}
	errs := make([]error, len(batch))
	for i := range batch {
		errs[i] = r.open(ctx, &batch[i])
	}
	var wg sync.WaitGroup
	for i, d := range batch {
		if errs[i] == nil {
			wg.Go(func() { errs[i] = r.fwd.Forward(context.WithoutCancel(ctx), d.rec) })
		}
	}
	wg.Wait()
	var acked []int64
	b := &pgx.Batch{}
	for i, d := range batch {
		if errs[i] == nil {
			acked = append(acked, d.id)
			if d.stub != nil {
				r.m.DeadLettered.WithLabelValues(r.cfg.Group).Inc()
				r.log.Error("idem: a deferred message's payload cannot be opened for good; dead-lettered as a stub, never published",
					"id", d.id, "key", d.ikey, "origin", d.origin.Topic, "partition", d.origin.Partition, "offset", d.origin.Offset,
					"to", d.rec.Topic, "err", d.stub)
			}
			continue
		}
		wait := r.retryWait(d.attempts + 1)
		r.m.PublishFailures.WithLabelValues(r.cfg.Group).Inc()
		r.log.Warn("idem: publishing a due deferred record failed; will retry", "id", d.id, "topic", d.rec.Topic,
			"attempts", d.attempts+1, "err", errs[i], "in", wait)
		b.Queue(`UPDATE `+table+` SET attempts = attempts + 1, last_error = $2, due_at = now() + make_interval(secs => $3)
			WHERE id = $1`, d.id, errs[i].Error(), wait.Seconds())
	}
	if r.cfg.afterAck != nil {
		r.cfg.afterAck(acked)
	}
	if len(acked) > 0 {
		b.Queue(`DELETE FROM `+table+` WHERE id = ANY($1)`, acked)
	}
	// Kafka has the acked records: record it even if ctx was cancelled
	// meanwhile, or a clean shutdown would publish them again.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.QueryTimeout)
	defer scancel()
	if err := conn.SendBatch(sctx, b).Close(); err != nil {
		return 0, fmt.Errorf("schedule: settle published rows: %w", err)
	}
	r.m.Published.WithLabelValues(r.cfg.Group).Add(float64(len(acked)))
	return len(batch), nil
}

// open makes d's record publishable: a row sealed at rest is opened into
// it (seal.Pack's value and headers). A row whose payload cannot be opened
// for good (seal.Unreadable: its data key destroyed, or tampered with)
// becomes the dead-letter stub of its message (wire.UnreadableStub), to
// d.dlq, or the default dead-letter topic of its origin. The error is a
// failure to publish now, retried as one: no key given (seal.ErrNoKey), a
// wrong key, the database.
func (r *runner) open(ctx context.Context, d *due) error {
	if d.keyID == nil {
		return nil
	}
	if r.sealer == nil {
		return fmt.Errorf("schedule: deferred row %d: %w (give the scheduler EncryptionKeyFile)", d.id, seal.ErrNoKey)
	}
	aad := tables.DeferredAAD(r.cfg.Group, d.rec.Topic, d.rec.Partition, d.ikey, d.origin)
	pt, err := r.sealer.Open(ctx, *d.keyID, d.sealed, aad)
	var hs []seal.Header
	if err == nil {
		d.rec.Value, hs, err = seal.Unpack(pt)
	}
	switch {
	case err == nil:
		d.rec.Headers = make([]sarama.RecordHeader, len(hs))
		for i, h := range hs {
			d.rec.Headers[i] = sarama.RecordHeader{Key: h.Key, Value: h.Value}
		}
		return nil
	case !seal.Unreadable(err):
		return fmt.Errorf("schedule: deferred row %d: %w", d.id, err)
	}
	d.stub = fmt.Errorf("deferred message's payload, sealed at rest, cannot be opened: %w", err)
	dlq := d.dlq
	if dlq == "" {
		dlq = retrytopic.Policy{}.DLQ(d.origin.Topic, r.cfg.Group)
	}
	src := wire.Source{Topic: d.origin.Topic, Partition: d.origin.Partition, Offset: d.origin.Offset, Group: r.cfg.Group}
	d.rec = forward.Record{Topic: dlq, Partition: d.origin.Partition, Key: d.rec.Key,
		Headers: wire.UnreadableStub(src, d.ikey, d.stub, time.Now())}
	return nil
}

// retryWait is a random wait in [1ms, min(RetryMax, RetryBase·2^(attempts-1))].
func (r *runner) retryWait(attempts int) time.Duration {
	ceil := r.cfg.RetryBase << min(attempts-1, 30)
	if ceil <= 0 || ceil > r.cfg.RetryMax {
		ceil = r.cfg.RetryMax
	}
	return max(rand.N(ceil+1), time.Millisecond)
}

// stats refreshes idem_schedule_pending.
func (r *runner) stats(ctx context.Context, conn *pgx.Conn) error {
	var n int64
	if err := r.row(ctx, conn, `SELECT count(*) FROM `+table+` WHERE consumer_group = $1`, r.cfg.Group).Scan(&n); err != nil {
		return fmt.Errorf("schedule: stats: %w", err)
	}
	r.m.Pending.WithLabelValues(r.cfg.Group).Set(float64(n))
	return nil
}

func (r *runner) row(ctx context.Context, conn *pgx.Conn, sql string, args ...any) pgx.Row {
	return pglead.QueryRow(ctx, conn, r.cfg.QueryTimeout, sql, args...)
}

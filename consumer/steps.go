package consumer

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/tables"
)

// Durable steps (package step) need three things from a handler's ctx: the
// database of idem_steps (the dedupe store's), the consumer group and the
// message's idempotency key. Each worker puts one tables.StepScope into its
// handlers' root ctx when it is made (newWorker) and sets the key before
// each handler call (callHandler, and a batch's call), so a call allocates
// nothing for it. A batch handler's steps name their message with step.For.
//
// A step reads its row in the handler's transaction and records it on a
// connection of its own, while the handler's holds one: from the store's
// pool, every lane of the member could hold one connection each and wait
// for another, for ever. So a step records through a pool of its own
// (stepPool), of the store's database, that only such short statements use.

// stepPoolSize bounds the connections steps record on, per member: each
// holds one for a single INSERT.
const stepPoolSize = 4

// stepPool returns the database steps record on: for a store on a
// *pgxpool.Pool, a pool of its own of the same database (stepPoolSize
// connections, opened when first used), closed by the returned function;
// for another store, its database itself (nil: none).
func stepPool(cfg Config) (dedupe.DB, func()) {
	db := storeDB(cfg.Dedupe)
	p, ok := db.(*pgxpool.Pool)
	if !ok || p == nil {
		return db, func() {}
	}
	pc := p.Config()
	pc.MaxConns, pc.MinConns = stepPoolSize, 0
	own, err := pgxpool.NewWithConfig(context.Background(), pc) // connects lazily: no I/O here
	if err != nil {
		return db, func() {}
	}
	return own, own.Close
}

// storeDB returns the database of s (dedupe.Postgres, dedupe.PostgresLease),
// or nil for a store without one (dedupe.NewMemory, a custom store).
func storeDB(s dedupe.Store) dedupe.DB {
	if d, ok := s.(interface{ DB() dedupe.DB }); ok {
		return d.DB()
	}
	if sw, ok := s.(sweepable); ok {
		if s := sw.Sweeper(); s != nil {
			return s.DB
		}
	}
	return nil
}

// stepSweepBatch is how many idem_steps rows one DELETE removes.
const stepSweepBatch = 1000

// sweepSteps deletes the rows of idem_steps older than the inbox's
// retention, with the inbox sweeper s's database, retention and interval,
// until ctx is done: a step is useful as long as its message's key is in
// the inbox. A database without the table (idem.Migrate not run; steps not
// used) is skipped quietly and looked at again at the next interval.
func sweepSteps(ctx context.Context, s *dedupe.Sweeper, log *slog.Logger) {
	every := s.Interval
	if every <= 0 {
		every = time.Minute
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := tables.SweepStepsOlder(ctx, s.DB, s.Retention, stepSweepBatch)
		var pe *pgconn.PgError
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case errors.As(err, &pe) && pe.Code == "42P01": // undefined_table
			log.Debug("idem: no idem_steps table to sweep", "err", err)
		case err != nil:
			log.Error("idem: step sweep failed; retrying at the next interval", "err", err)
		case n > 0:
			log.Info("idem: swept old step rows", "deleted", n, "retention", s.Retention)
		}
		t.Reset(every)
	}
}

package dedupe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemhq/idem/internal/tables"
)

// Sweeper deletes old inbox rows so the table does not grow forever.
//
// On a partitioned inbox (WithPartitions) it deletes no row: each sweep
// drops the partitions that end more than Retention ago (DETACH PARTITION
// … CONCURRENTLY, then DROP TABLE), so a key is kept at least Retention and
// at most Retention plus one partition's width, and it makes the
// partitions of the next two intervals ahead of time. BatchSize is unused
// there. It finds the table's layout itself at each sweep.
//
// The retention rule: Retention must exceed the longest time after which the
// same message can be delivered again — the total of the retry-topic delays,
// the time a message may sit in the dead-letter topic before an operator
// replays it, and any topic replay (offset reset) you might perform. Once a
// key's row is swept, a redelivered or replayed message with that key runs
// its handler again. When in doubt, keep more: a row costs a few dozen bytes.
//
// A row is deleted when its processed_at is older than now() − Retention
// (measured by the database clock) and it is either done or an expired
// PostgresLease claim. Deletion proceeds in batches of BatchSize rows, each
// its own statement, so locks are short and replication is not flooded.
//
// Configure the exported fields, then call Run in a goroutine you own (or
// SweepOnce from a cron job). Several sweepers on one table are safe: rows
// locked by one are skipped by the others.
type Sweeper struct {
	// DB is the database holding the table. Required.
	DB DB
	// Table is the inbox table, as for WithTable ("table" or "schema.table").
	// Default: "idem_processed".
	Table string
	// Retention is how long a recorded key is kept; see the retention rule
	// on Sweeper. Must be at least 1h.
	// Default: 336h (14 days).
	Retention time.Duration
	// BatchSize is the most rows one DELETE removes; between 1 and 1,000,000.
	// Default: 1000.
	BatchSize int
	// Interval is the pause Run takes between sweeps.
	// Default: 1m.
	Interval time.Duration
	// Logger receives a line per sweep that deleted rows, and sweep errors.
	// Default: slog.Default().
	Logger *slog.Logger

	// every is the store's WithPartitions, the width of the partitions a
	// sweep makes ahead; 0: that of the newest partition.
	every time.Duration
}

// withDefaults returns s with every zero field replaced by its default. It is
// the one place the Sweeper's defaults live.
func (s Sweeper) withDefaults() Sweeper {
	if s.Table == "" {
		s.Table = defaultTable
	}
	if s.Retention == 0 {
		s.Retention = tables.DefaultInboxRetention
	}
	if s.BatchSize == 0 {
		s.BatchSize = defaultBatchSize
	}
	if s.Interval == 0 {
		s.Interval = defaultSweepInterval
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return s
}

// Validate reports, after applying defaults, whether the configuration is
// usable; the error wraps ErrInvalidConfig and names the field, its value and
// the rule. SweepOnce and Run call it.
func (s *Sweeper) Validate() error {
	c := s.withDefaults()
	var errs []error
	if c.DB == nil {
		errs = append(errs, fmt.Errorf("%w: Sweeper.DB is nil: set it to the *pgxpool.Pool holding the inbox table", ErrInvalidConfig))
	}
	if _, err := parseTable(c.Table); err != nil {
		errs = append(errs, fmt.Errorf("Sweeper.Table: %w", err))
	}
	if c.Retention < tables.MinInboxRetention {
		errs = append(errs, fmt.Errorf("%w: Sweeper.Retention is %v, want at least %v and longer than the longest retry/DLQ-replay window (0 selects %v)",
			ErrInvalidConfig, c.Retention, tables.MinInboxRetention, tables.DefaultInboxRetention))
	}
	if c.BatchSize < 1 || c.BatchSize > 1_000_000 {
		errs = append(errs, fmt.Errorf("%w: Sweeper.BatchSize is %d, want 1..1000000 (0 selects %d)", ErrInvalidConfig, c.BatchSize, defaultBatchSize))
	}
	if c.Interval < 0 {
		errs = append(errs, fmt.Errorf("%w: Sweeper.Interval is %v, want > 0 (0 selects %v)", ErrInvalidConfig, c.Interval, defaultSweepInterval))
	}
	return errors.Join(errs...)
}

// SweepOnce deletes every row older than the retention horizon, BatchSize
// rows per statement, until none is left, and returns how many it deleted.
// The horizon is fixed once, at the start of the call. On error it returns
// the rows deleted so far and the error.
//
// On a partitioned table it drops the partitions past the horizon and makes
// the partitions ahead instead, and returns the rows of the dropped
// partitions as PostgreSQL's statistics estimate them (pg_class.reltuples:
// counting them would read them).
func (s *Sweeper) SweepOnce(ctx context.Context) (deleted int64, err error) {
	if err := s.Validate(); err != nil {
		return 0, err
	}
	c := s.withDefaults()
	t, _ := parseTable(c.Table)
	t.every = s.every
	rel, err := t.lookup(ctx, c.DB)
	if err != nil {
		return 0, fmt.Errorf("dedupe: sweep %s: %w", t.quoted, err)
	}
	if rel.kind == "p" {
		return t.sweepPartitions(ctx, c)
	}

	var horizon time.Time
	if err := c.DB.QueryRow(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", c.Retention.Microseconds()).Scan(&horizon); err != nil {
		return 0, fmt.Errorf("dedupe: sweep %s: read horizon: %w", t.quoted, err)
	}
	// ctid = ANY(ARRAY(subquery)) is the batched form of ctid IN (SELECT ctid
	// … LIMIT n) that PostgreSQL always executes as a TID scan.
	q := `DELETE FROM ` + t.quoted + ` WHERE ctid = ANY(ARRAY(SELECT ctid FROM ` + t.quoted +
		` WHERE processed_at < $1 AND (status = 'done' OR lease_until < now())` +
		` LIMIT $2 FOR UPDATE SKIP LOCKED))`
	for {
		tag, err := c.DB.Exec(ctx, q, horizon, c.BatchSize)
		if err != nil {
			return deleted, fmt.Errorf("dedupe: sweep %s: delete batch: %w", t.quoted, err)
		}
		deleted += tag.RowsAffected()
		if tag.RowsAffected() < int64(c.BatchSize) {
			return deleted, nil
		}
	}
}

// sweepPartitions is SweepOnce on a partitioned table.
func (t table) sweepPartitions(ctx context.Context, c Sweeper) (int64, error) {
	made, err := t.ensurePartitions(ctx, c.DB)
	if len(made) > 0 {
		c.Logger.InfoContext(ctx, "dedupe: made inbox partitions ahead", "table", c.Table, "partitions", made)
	}
	if err != nil {
		return 0, fmt.Errorf("dedupe: sweep %s: %w", t.quoted, err)
	}
	dropped, rows, err := t.dropExpired(ctx, c.DB, c.Retention)
	if len(dropped) > 0 {
		c.Logger.InfoContext(ctx, "dedupe: dropped inbox partitions past the retention",
			"table", c.Table, "partitions", dropped, "rows_estimated", rows, "retention", c.Retention)
	}
	if err != nil {
		return rows, fmt.Errorf("dedupe: sweep %s: %w", t.quoted, err)
	}
	return rows, nil
}

// Run sweeps at once and then every Interval until ctx is done, and returns
// nil then. A failed sweep is logged and retried at the next interval; only a
// configuration error is returned (immediately).
func (s *Sweeper) Run(ctx context.Context) error {
	if err := s.Validate(); err != nil {
		return err
	}
	c := s.withDefaults()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		n, err := s.SweepOnce(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return nil
		case err != nil:
			c.Logger.ErrorContext(ctx, "dedupe: sweep failed; retrying at next interval",
				"table", c.Table, "deleted", n, "interval", c.Interval, "err", err)
		case n > 0:
			c.Logger.InfoContext(ctx, "dedupe: swept old inbox rows",
				"table", c.Table, "deleted", n, "retention", c.Retention)
		}
		timer.Reset(c.Interval)
	}
}

// The stores whose keys live in a PostgreSQL table a Sweeper can clean,
// Postgres and PostgresLease, have a Sweeper method; consumer.Run starts
// the sweeper of a store that has one (consumer.Config.Retention).
var (
	_ interface{ Sweeper() *Sweeper } = (*Postgres)(nil)
	_ interface{ Sweeper() *Sweeper } = (*PostgresLease)(nil)
)

// Sweeper returns a Sweeper over the store's database and table, with every
// other field at its default (set Retention to the retention you need
// before running it); nil when the store's configuration is invalid
// (Migrate and Process report that error). consumer.Run runs it unless
// consumer.Config.Retention.NoSweep; a service using the store without
// consumer.Run runs it itself.
func (p *Postgres) Sweeper() *Sweeper {
	if p.err != nil {
		return nil
	}
	return &Sweeper{DB: p.db, Table: p.table.name, every: p.table.every}
}

// Sweeper returns a Sweeper over the store's database and table, as
// Postgres.Sweeper does.
func (p *PostgresLease) Sweeper() *Sweeper {
	if p.err != nil {
		return nil
	}
	return &Sweeper{DB: p.db, Table: p.table.name, every: p.table.every}
}

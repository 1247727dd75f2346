package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/internal/tables"
)

// RetentionConfig is Config.Retention: how long the inbox keeps a key and
// who deletes the older ones. A message delivered again after its key was
// deleted runs its handler again, so the inbox must remember a key for as
// long as a copy of its message may arrive.
//
// When Dedupe is a PostgreSQL store (dedupe.NewPostgres,
// dedupe.NewPostgresLease: any store with a Sweeper method) and NoSweep is false, Run
// starts a dedupe.Sweeper on its table that deletes, every minute, the rows
// processed more than Keep ago; it stops with Run. The sweeper deletes old
// rows of every consumer group in the table, so services sharing one inbox
// table must agree on Keep (or use dedupe.WithTable). Validate then requires
// Keep to be at least 1h (the sweeper's minimum) and the retention of the
// retry-tier and dead-letter topics (Retry.Tiers.Retention, 7 days by
// default): a failed record can wait that long in a tier, or in the
// dead-letter topic until an operator replays it, and a second copy of an
// already handled message (forwarded twice after a crash, or sent twice by
// its producer) must still find its key.
//
// Either way, Run compares Keep at start with each source topic's
// retention.ms and warns, naming both numbers, when the inbox forgets
// sooner than Kafka keeps records: a record re-read after its key was
// deleted (expired group offsets, an offset reset) would be applied twice.
type RetentionConfig struct {
	// Keep is how long the inbox keeps a key. With NoSweep, or a store Run
	// does not sweep (dedupe.NewMemory, a custom store), it only tells Run
	// how long the store keeps keys, for the check against retention.ms;
	// left 0 there, it is unknown and nothing is checked. Negative is an
	// error.
	// Default: 0 (14 days, the sweeper's default, when Run sweeps; unknown when it does not).
	Keep time.Duration

	// NoSweep stops Run from sweeping the inbox: you sweep it yourself (a
	// dedupe.Sweeper or a cron job of your own), and the table grows until
	// you do.
	// Default: false (Run sweeps a store with a Sweeper method).
	NoSweep bool
}

// sweepable is a store Run sweeps: one with a Sweeper method
// (dedupe.Postgres, dedupe.PostgresLease).
type sweepable interface{ Sweeper() *dedupe.Sweeper }

// retention checks Config.Retention (defaults applied): Keep is
// never negative, and when Run sweeps the store it covers the sweeper's
// minimum and the retention of the retry-tier and dead-letter topics (see
// RetentionConfig).
func (c configCheck) retention() {
	if c.Retention.Keep < 0 {
		c.errs.Bad("Retention.Keep", c.Retention.Keep, "must be >= 0 (0: the default); to stop Run sweeping the inbox, set Retention.NoSweep")
		return
	}
	if _, swept := c.Dedupe.(sweepable); !swept || c.Retention.NoSweep {
		return // Run does not sweep: Keep is only compared with the topics'
	}
	keep := inboxRetention(c.Config)
	if keep < tables.MinInboxRetention {
		c.errs.Bad("Retention.Keep", keep, fmt.Sprintf("must be at least %s (the sweeper's minimum), or set Retention.NoSweep and sweep the inbox yourself", tables.MinInboxRetention))
		return
	}
	if tiers := c.Retry.Tiers.WithDefaults().Retention; keep < tiers {
		c.errs.Bad("Retention.Keep", keep, fmt.Sprintf("must be at least Retry.Tiers.Retention (%s): a record may wait that long in a retry tier or the dead-letter topic before it is handled or replayed, and a copy of a message handled meanwhile must still find its key (raise Retention.Keep, or lower Retry.Tiers.Retention)", tiers))
	}
}

// inboxSweeper returns the inbox sweeper Run starts, or nil when Run does not
// sweep (Retention.NoSweep, or a store that is not sweepable).
func inboxSweeper(cfg Config, log *slog.Logger) *dedupe.Sweeper {
	if cfg.Retention.NoSweep {
		return nil
	}
	sw, ok := cfg.Dedupe.(sweepable)
	if !ok {
		return nil
	}
	s := sw.Sweeper()
	if s == nil {
		return nil
	}
	s.Retention = inboxRetention(cfg)
	s.Logger = log
	return s
}

// inboxRetention is how long the inbox keeps keys, as far as Run knows:
// Retention.Keep, or tables.DefaultInboxRetention when it is 0 and Run sweeps
// (0: unknown, when it does not).
func inboxRetention(cfg Config) time.Duration {
	if cfg.Retention.Keep != 0 {
		return cfg.Retention.Keep
	}
	if _, swept := cfg.Dedupe.(sweepable); swept && !cfg.Retention.NoSweep {
		return tables.DefaultInboxRetention
	}
	return 0
}

// sweep runs the inbox sweeper, if Run has one, and the sweeper of
// idem_steps with its retention (sweepSteps), until ctx is done. Its
// configuration was checked by Config.Validate; an error it still reports is
// logged.
func sweep(ctx context.Context, cfg Config, log *slog.Logger) {
	s := inboxSweeper(cfg, log)
	if s == nil {
		return
	}
	log.Debug("idem: inbox sweeper started", "table", s.Table, "retention", s.Retention)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { sweepSteps(ctx, s, log) }) // idem_steps, with the inbox's retention
	if err := s.Run(ctx); err != nil {
		log.Error("idem: inbox sweeper not started", "err", err)
	}
}

package consumer

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/idemhq/idem/dedupe"
)

// validateRetention checks Config.Retention (defaults applied) against the
// sweeper's minimum and the retention of the retry-tier and dead-letter
// topics (see Config.Retention), when Run sweeps the store.
func validateRetention(c Config, bad func(field string, v any, rule string)) {
	if _, swept := c.Dedupe.(dedupe.Sweepable); !swept || c.Retention < 0 {
		return // Run does not sweep: Retention is not used
	}
	if c.Retention < dedupe.MinRetention {
		bad("Retention", c.Retention, fmt.Sprintf("must be at least %s (dedupe.MinRetention), or negative to disable the sweeper", dedupe.MinRetention))
		return
	}
	if tiers := c.Retry.Tiers.WithDefaults().Retention; c.Retention < tiers {
		bad("Retention", c.Retention, fmt.Sprintf("must be at least Retry.Tiers.Retention (%s): a record may wait that long in a retry tier or the dead-letter topic before it is handled or replayed, and a copy of a message handled meanwhile must still find its key (raise Retention, or lower Retry.Tiers.Retention)", tiers))
	}
}

// sweeper returns the inbox sweeper Run starts, or nil when Run does not
// sweep (Retention negative, or a store that is not dedupe.Sweepable).
func inboxSweeper(cfg Config, log *slog.Logger) *dedupe.Sweeper {
	if cfg.Retention < 0 {
		return nil
	}
	sw, ok := cfg.Dedupe.(dedupe.Sweepable)
	if !ok {
		return nil
	}
	s := sw.Sweeper()
	if s == nil {
		return nil
	}
	s.Retention = cfg.Retention
	s.Logger = log
	return s
}

// inboxRetention is how long the inbox keeps keys, as far as Run knows:
// Retention when Run sweeps, else InboxRetention (0: unknown).
func inboxRetention(cfg Config) time.Duration {
	if inboxSweeper(cfg, nil) != nil {
		return cfg.Retention
	}
	return cfg.InboxRetention
}

// sweep runs the inbox sweeper, if Run has one, until ctx is done. Its
// configuration was checked by Config.Validate; an error it still reports is
// logged.
func sweep(ctx context.Context, cfg Config, log *slog.Logger) {
	s := inboxSweeper(cfg, log)
	if s == nil {
		return
	}
	log.Debug("idem: inbox sweeper started", "table", s.Table, "retention", s.Retention)
	if err := s.Run(ctx); err != nil {
		log.Error("idem: inbox sweeper not started", "err", err)
	}
}

package consumer

import (
	"context"
	"log/slog"
	"sync"

	"github.com/idemhq/idem/outbox"
)

// relay returns the Config's outbox relay with its empty Brokers, Sarama,
// Logger and Registerer taken from c, or nil when none is configured.
func (c Config) relay() *outbox.Relay {
	if c.Relay == nil {
		return nil
	}
	rl := *c.Relay
	if len(rl.Brokers) == 0 {
		rl.Brokers = c.Brokers
	}
	if rl.Sarama == nil {
		rl.Sarama = c.Sarama
	}
	if rl.Logger == nil {
		rl.Logger = c.Logger
	}
	if rl.Registerer == nil {
		rl.Registerer = c.Registerer
	}
	return &rl
}

// validateRelay checks Config.Relay as Run will run it.
func (c Config) validateRelay() error {
	if rl := c.relay(); rl != nil {
		return rl.Validate()
	}
	return nil
}

// startRelay runs Config.Relay on wg until ctx is done, and has Run's
// Readiness report its outbox.Health (the Config's own, or a new one): the
// consumer is not ready while the relay cannot run. The relay retries its
// start-up (migration, producer) and every database or broker outage by
// itself, for as long as ctx lasts; Run returns an error only for a
// configuration Validate already rejected or a Registerer that holds its
// collectors already, which is logged and stops only the relay, so
// consuming goes on, rows wait in the outbox (idem_outbox_pending) and the
// consumer stays not ready.
func startRelay(ctx context.Context, wg *sync.WaitGroup, cfg Config, ready *Readiness, log *slog.Logger) {
	rl := cfg.relay()
	if rl == nil {
		return
	}
	if rl.Health == nil {
		rl.Health = new(outbox.Health)
	}
	ready.setRelay(rl.Health.Err)
	wg.Go(func() {
		if err := rl.Run(ctx); err != nil {
			ready.setRelay(func() error { return err })
			log.Error("idem: outbox relay stopped; events wait in the outbox until it runs again", "err", err)
		}
	})
}

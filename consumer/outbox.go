package consumer

import (
	"context"
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

// startRelay runs Config.Relay on wg until ctx is done. The relay retries
// database and broker outages itself; an error it returns (a failed
// migration, a producer sarama refuses) stops only the relay and is logged,
// so consuming goes on and rows wait in the outbox (idem_outbox_pending).
func (r *runner) startRelay(ctx context.Context, wg *sync.WaitGroup) {
	rl := r.cfg.relay()
	if rl == nil {
		return
	}
	wg.Go(func() {
		if err := rl.Run(ctx); err != nil {
			r.log.Error("idem: outbox relay stopped; events wait in the outbox until it runs again", "err", err)
		}
	})
}

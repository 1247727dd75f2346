package consumer

import (
	"context"
	"log/slog"
	"sync"

	"github.com/idemhq/idem/console/index"
)

// failureIndex returns the Config's failure indexer with its empty Brokers,
// Sarama, Logger and Registerer taken from c and, when it names no topics,
// the dead-letter topic of each of c.Topics; nil when none is configured.
func (c Config) failureIndex() *index.Indexer {
	if c.FailureIndex == nil {
		return nil
	}
	ix := *c.FailureIndex
	if len(ix.Brokers) == 0 {
		ix.Brokers = c.Brokers
	}
	if ix.Sarama == nil {
		ix.Sarama = c.Sarama
	}
	if ix.Logger == nil {
		ix.Logger = c.Logger
	}
	if ix.Registerer == nil {
		ix.Registerer = c.Registerer
	}
	if len(ix.Topics) == 0 && ix.TopicPattern == nil {
		for _, t := range c.Topics {
			ix.Topics = append(ix.Topics, c.dlqTopics(t)...)
		}
	}
	return &ix
}

// startFailureIndex runs Config.FailureIndex on wg until ctx is done. The
// indexer retries its own start and every outage; it returns an error only
// for a configuration Validate already checked or a Registerer that holds
// its collectors already, which is logged: consuming goes on, and the
// dead-letter topics keep every record for a later indexer.
func startFailureIndex(ctx context.Context, wg *sync.WaitGroup, cfg Config, log *slog.Logger) {
	ix := cfg.failureIndex()
	if ix == nil {
		return
	}
	wg.Go(func() {
		if err := ix.Run(ctx); err != nil {
			log.Error("idem: failure indexer stopped; dead-lettered records are not indexed until it runs again", "err", err)
		}
	})
}

package tables

// What package dedupe shares with package consumer
// about the inbox's retention: the retention a dedupe.Sweeper applies when
// its Retention is zero, and the smallest it accepts. consumer.Run checks
// Config.Retention against them before it starts the sweeper; dedupe
// documents both on Sweeper.Retention ("Default:" line, checked by its
// tests).

import "time"

const (
	// DefaultInboxRetention is dedupe.Sweeper.Retention when zero, and the
	// retention consumer.Run's sweeper applies when Retention.Keep is 0.
	DefaultInboxRetention = 14 * 24 * time.Hour
	// MinInboxRetention is the smallest dedupe.Sweeper.Retention (and
	// consumer.Config.Retention.Keep, when Run sweeps) that Validate accepts.
	MinInboxRetention = time.Hour
)

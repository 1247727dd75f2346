package draw

import (
	"encoding/json"
	"time"
)

// This file is the members' configuration a draw holds (Config, with its
// rules and dependency specs) and the budgets it implies, with the
// Duration and Window types a draw writes its times in.

// Duration is a time.Duration that reads and writes as text ("1.5s").
type Duration time.Duration

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads text written by MarshalJSON.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Window is a period of the run, from its start (the members' T0).
type Window struct {
	From Duration `json:"from"`
	To   Duration `json:"to"`
}

// In reports whether the instant at, since the start, falls in w.
func (w Window) In(at time.Duration) bool { return at >= w.From.D() && at < w.To.D() }

// Config is the members' configuration: what the member program
// (internal/testing/chaos/swarmmember) builds its consumer.Config from. Zero values
// mean the feature is off.
type Config struct {
	Partitions   int        `json:"partitions"`           // of the source topic
	Members      int        `json:"members"`              // slots started at first
	Attempts     int        `json:"attempts"`             // Retry.Attempts
	Tiers        []Duration `json:"tiers,omitempty"`      // Retry.Tiers.Delays
	BatchSize    int        `json:"batch_size,omitempty"` // Batch.MaxMessages
	BatchHandler bool       `json:"batch_handler,omitzero"`
	Concurrency  int        `json:"concurrency"`            // 1, 4 or 16
	AdaptiveMax  int        `json:"adaptive_max,omitempty"` // Limits.Adaptive.Max
	Ordering     bool       `json:"ordering,omitzero"`
	Transactions bool       `json:"transactions,omitzero"`
	TxnTimeout   Duration   `json:"txn_timeout,omitzero"` // Transactions.Timeout
	InstanceIDs  bool       `json:"instance_ids,omitzero"`
	// RuleLadder is the "ladder" rule: errors of the workload's kind
	// "ladder" climb a ladder of their own.
	RuleLadder *LadderRule `json:"rule_ladder,omitempty"`
	// RuleDLQ is the "fraud" rule: one attempt, no tiers, its own DLQ.
	RuleDLQ bool `json:"rule_dlq,omitzero"`
	// RuleDLQTiers: the "fraud" rule climbs the fallback's tiers before its
	// own DLQ (with Ordering, the only rule whose records can be promoted
	// heads bound for a dead-letter topic of their own).
	RuleDLQTiers bool `json:"rule_dlq_tiers,omitzero"`
	// Tier1MaxBytes, when set, is the first tier's max.message.bytes
	// (the harness creates it): the workload's "big" records fail into it
	// and it refuses them, so they go to their dead-letter topic whole.
	Tier1MaxBytes int      `json:"tier1_max_bytes,omitempty"`
	MaxAge        Duration `json:"max_age,omitzero"` // Expiry.MaxAge
	Defer         bool     `json:"defer,omitzero"`
	HookDLQ       bool     `json:"hook_dead_lettered,omitzero"`
	HookExpired   bool     `json:"hook_expired,omitzero"`
	HookFail      []Window `json:"hook_fail,omitempty"` // the hooks return an error in these windows
	// Breaker: dependency A has limits and is down in its windows (the
	// breaker opens); Throttle: dependency B answers 429 in its windows.
	Breaker      *BreakerSpec `json:"breaker,omitempty"`
	Throttle     []Window     `json:"throttle,omitempty"`
	RetryAfter   Duration     `json:"retry_after,omitzero"` // of B's 429s
	Outbox       bool         `json:"outbox,omitzero"`
	OutboxEO     bool         `json:"outbox_exactly_once,omitzero"`
	DLQMaxBytes  int          `json:"dlq_max_bytes,omitempty"` // the fallback DLQ is created with this max.message.bytes
	Backoff      Duration     `json:"backoff"`                 // Retry.Backoff.Max (Base is a tenth)
	BreakerOpen  Duration     `json:"breaker_open,omitzero"`   // Settings.OpenTimeout
	SessionTimer Duration     `json:"session_timeout"`         // Sarama Consumer.Group.Session.Timeout
}

// LadderRule is the "ladder" rule's budget and ladder.
type LadderRule struct {
	Attempts int        `json:"attempts"`
	Delays   []Duration `json:"delays"`
}

// BreakerSpec is dependency A: its flow limits and when it is down.
type BreakerSpec struct {
	Rate        float64  `json:"rate"`
	Burst       int      `json:"burst"`
	MaxInFlight int      `json:"max_in_flight"`
	Down        []Window `json:"down"`
}

// Budget is the handler calls a message failing with an error no rule
// matches gets before the DLQ: Attempts per delivery, at the source and in
// each tier.
func (c Config) Budget() int { return max(c.Attempts, 1) * (1 + len(c.Tiers)) }

// LadderBudget is the same for the "ladder" rule's errors.
func (c Config) LadderBudget() int {
	if c.RuleLadder == nil {
		return c.Budget()
	}
	return max(c.RuleLadder.Attempts, 1) * (1 + len(c.RuleLadder.Delays))
}

package draw

import (
	"errors"
	"time"

	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// Member is what the harness hands each member process, as its -config
// file: the draw's Config, the run's names and the instant the draw's
// windows count from.
type Member struct {
	Config
	Topic  string    `json:"topic"`  // the source topic
	Group  string    `json:"group"`  // the consumer group
	Events string    `json:"events"` // the outbox events' topic (with Outbox)
	T0     time.Time `json:"t0"`     // the windows (HookFail, Breaker.Down, Throttle) count from here
}

// The rules' names and their ladder's.
const (
	RuleLadderName = "ladder"
	RuleDLQName    = "fraud"
	LadderName     = "slow"
)

// FraudDLQ is the "fraud" rule's own dead-letter topic.
func (m *Member) FraudDLQ() string { return m.Topic + "." + m.Group + ".dlq.fraud" }

// DeferredTopic is where Config.Defer publishes deferred records.
func (m *Member) DeferredTopic() string { return m.Topic + "." + m.Group + ".deferred" }

// Fallback is the consumer's retry policy without rules: Retry.Attempts,
// Retry.Backoff and Retry.Tiers.
func (m *Member) Fallback() recovery.Fallback {
	delays := make([]time.Duration, len(m.Tiers))
	for i, d := range m.Tiers {
		delays[i] = d.D()
	}
	return recovery.Fallback{Attempts: m.Attempts, Backoff: m.backoff(), Retry: retrytopic.Policy{Delays: delays}}
}

func (m *Member) backoff() recovery.Backoff {
	return recovery.Backoff{Base: m.Backoff.D() / 10, Max: m.Backoff.D()}
}

// Rules are Retry.Rules: "ladder" (errors ladder matches climb a ladder of
// their own) and "fraud" (errors fraud matches go to FraudDLQ after one
// attempt), those the draw has.
func (m *Member) Rules(ladder, fraud recovery.Matcher) []recovery.Rule {
	var rs []recovery.Rule
	if l := m.RuleLadder; l != nil {
		delays := make([]time.Duration, len(l.Delays))
		for i, d := range l.Delays {
			delays[i] = d.D()
		}
		rs = append(rs, recovery.Rule{Name: RuleLadderName, Match: ladder, Attempts: l.Attempts, Tiers: &recovery.Ladder{Name: LadderName, Delays: delays}})
	}
	if m.RuleDLQ {
		tiers := &recovery.Ladder{} // straight to its DLQ
		if m.RuleDLQTiers {
			tiers = nil // the fallback's tiers, then its own DLQ
		}
		rs = append(rs, recovery.Rule{Name: RuleDLQName, Match: fraud, Attempts: 1, Tiers: tiers, DLQ: m.FraudDLQ()})
	}
	return rs
}

// Topics are the retry tiers (every ladder's) and the dead-letter topics
// the members forward to.
func (m *Member) Topics() (tiers, dlqs []string, err error) {
	never := recovery.Func("never", func(error) bool { return false })
	p, err := recovery.New(m.Fallback(), m.Rules(never, never)...)
	if err != nil {
		return nil, nil, errors.Join(errors.New("draw: the members' retry policy"), err)
	}
	return p.TierTopics(m.Topic, m.Group), p.DLQTopics(m.Topic, m.Group), nil
}

// Since is how long after T0 the instant t is.
func (m *Member) Since(t time.Time) time.Duration { return t.Sub(m.T0) }

// InAny reports whether at, since T0, falls in one of ws.
func InAny(ws []Window, at time.Duration) bool {
	for _, w := range ws {
		if w.In(at) {
			return true
		}
	}
	return false
}

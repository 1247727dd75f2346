package retrytopic

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// defaultRetention is the retention.ms the consumer gives the tier and
// dead-letter topics it creates when Policy.Retention is zero.
const defaultRetention = 7 * 24 * time.Hour

// defaultReplicationFactor asks the broker for its default.replication.factor.
// It is what a zero Policy.ReplicationFactor means.
const defaultReplicationFactor int16 = -1

// defaultTierTopic names retry tier n (n = 1…) of topic as consumed by group:
// "<topic>.<group>.retry.<n>", e.g. "payments.billing.retry.1".
func defaultTierTopic(topic, group string, n int) string {
	return topic + "." + group + ".retry." + strconv.Itoa(n)
}

// defaultDLQTopic names the dead-letter topic of topic as consumed by group:
// "<topic>.<group>.dlq", e.g. "payments.billing.dlq".
func defaultDLQTopic(topic, group string) string {
	return topic + "." + group + ".dlq"
}

// Policy says where a failed record goes after the in-process retries: through
// retry tiers 1…len(Delays), each consumed no sooner than its delay after the
// failure, and finally to the dead-letter topic.
//
// The zero Policy is useful: no retry tiers, failures go straight to the
// dead-letter topic "<topic>.<group>.dlq".
//
// Topic names are always derived from the ORIGINAL topic (idem-original-topic)
// and the consumer group, never from a tier's own name, so a record moving
// from tier 1 to tier 2 keeps one family of names.
type Policy struct {
	// Delays[i] is how long a record sent to tier i+1 waits, measured from the
	// failure that sent it there, before it is handed to the handler again:
	// the record's idem-due-at is the failure time plus Delays[i], rounded up
	// to the millisecond, never earlier.
	//
	// A handler.RetryAfter error is capped at the delay of the tier the record
	// is sent to: it never pushes a due time past failure + Delays[i] (and
	// never brings it earlier). So due times within one tier partition stay in
	// the order the records were written, and no record can hold a tier
	// partition for longer than its delay. Give the tiers delays that cover
	// what your dependencies ask for.
	//
	// Each delay must be > 0 and at most half of Retention (a record must not
	// expire in its tier before it is due, or a restart loses it). Usually
	// non-decreasing (1s, 10s, 1m), but not required.
	//
	// Default: none (no retry tiers; failures go to the dead-letter topic).
	Delays []time.Duration

	// TierTopic names retry tier n (1-based) for topic and group. It must give
	// non-empty, legal, distinct names for every n in 1…len(Delays).
	//
	// Default: "<topic>.<group>.retry.<n>", e.g. "payments.billing.retry.1"
	// (Policy{}.Tier gives the default name).
	TierTopic func(topic, group string, n int) string

	// DLQTopic names the dead-letter topic for topic and group.
	//
	// Default: "<topic>.<group>.dlq", e.g. "payments.billing.dlq" (Policy{}.DLQ
	// gives the default name).
	DLQTopic func(topic, group string) string

	// Retention is the retention of the tier and dead-letter topics that
	// the consumer creates. A negative value keeps records forever
	// (retention.ms=-1). Existing topics are not altered.
	//
	// Default: 7 days.
	// Kafka: topic config retention.ms.
	Retention time.Duration

	// ReplicationFactor of the topics the consumer creates; -1 (or 0) asks for
	// the broker's default.
	//
	// Default: -1 (the broker's default.replication.factor).
	// Kafka: CreateTopics replication_factor.
	ReplicationFactor int16
}

// WithDefaults returns p with every zero field replaced by its documented
// default. It is the one place the defaults live.
func (p Policy) WithDefaults() Policy {
	if p.TierTopic == nil {
		p.TierTopic = defaultTierTopic
	}
	if p.DLQTopic == nil {
		p.DLQTopic = defaultDLQTopic
	}
	if p.Retention == 0 {
		p.Retention = defaultRetention
	}
	if p.ReplicationFactor == 0 {
		p.ReplicationFactor = defaultReplicationFactor
	}
	return p
}

// ErrInvalidPolicy is wrapped by every error Policy.Validate and
// Policy.ValidateNames return.
var ErrInvalidPolicy = errors.New("retrytopic: invalid policy")

// Validate checks p on its own: every delay is > 0 and at most half the
// tiers' retention (Retention, default 7 days; no bound when it is
// negative), the replication factor is -1, 0 or positive, and the naming
// functions give non-empty, legal, distinct names for a sample topic and
// group. It reports every problem at once (errors.Join). Use ValidateNames
// to check the names a real topic and group give.
func (p Policy) Validate() error {
	retention := p.WithDefaults().Retention
	var errs []error
	for i, d := range p.Delays {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%w: Delays[%d] = %s, must be > 0", ErrInvalidPolicy, i, d))
		} else if retention > 0 && d > retention/2 {
			errs = append(errs, fmt.Errorf("%w: Delays[%d] = %s (tier %d) is more than half its retention %s: a record could expire in the tier before it is due; shorten the delay or raise Retention to at least %s",
				ErrInvalidPolicy, i, d, i+1, retention, 2*d))
		}
	}
	if p.ReplicationFactor < -1 {
		errs = append(errs, fmt.Errorf("%w: ReplicationFactor = %d, must be -1 (broker default) or > 0", ErrInvalidPolicy, p.ReplicationFactor))
	}
	return errors.Join(append(errs, p.ValidateNames("topic", "group"))...)
}

// ValidateNames checks that, for topic and group, every tier name and the
// dead-letter name are non-empty, legal Kafka topic names, distinct from each
// other and from topic itself. It reports every problem at once.
func (p Policy) ValidateNames(topic, group string) error {
	seen := map[string]string{topic: "the source topic"}
	var errs []error
	check := func(what, name string) {
		if err := validTopicName(name); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s for topic %q group %q: %v", ErrInvalidPolicy, what, topic, group, err))
			return
		}
		if prev, dup := seen[name]; dup {
			errs = append(errs, fmt.Errorf("%w: %s for topic %q group %q is %q, the same as %s", ErrInvalidPolicy, what, topic, group, name, prev))
			return
		}
		seen[name] = what
	}
	for n := 1; n <= len(p.Delays); n++ {
		check(fmt.Sprintf("TierTopic(n=%d)", n), p.Tier(topic, group, n))
	}
	check("DLQTopic", p.DLQ(topic, group))
	return errors.Join(errs...)
}

// validTopicName applies Kafka's topic name rules: 1…249 characters of
// [a-zA-Z0-9._-], and not "." or "..".
func validTopicName(name string) error {
	switch {
	case name == "":
		return errors.New("name is empty")
	case len(name) > 249:
		return fmt.Errorf("name %q is %d characters, Kafka allows 249", name, len(name))
	case name == "." || name == "..":
		return fmt.Errorf("name %q is not allowed", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("name %q has %q; Kafka allows only [a-zA-Z0-9._-]", name, r)
		}
	}
	return nil
}

// Tier returns the name of retry tier n (1-based) of topic for group.
func (p Policy) Tier(topic, group string, n int) string {
	if p.TierTopic == nil {
		return defaultTierTopic(topic, group, n)
	}
	return p.TierTopic(topic, group, n)
}

// DLQ returns the name of the dead-letter topic of topic for group.
func (p Policy) DLQ(topic, group string) string {
	if p.DLQTopic == nil {
		return defaultDLQTopic(topic, group)
	}
	return p.DLQTopic(topic, group)
}

// Tiers returns the names of retry tiers 1…len(Delays) of topic for group, in
// order; nil for a policy without tiers.
func (p Policy) Tiers(topic, group string) []string {
	if len(p.Delays) == 0 {
		return nil
	}
	names := make([]string, len(p.Delays))
	for i := range p.Delays {
		names[i] = p.Tier(topic, group, i+1)
	}
	return names
}

// Topics returns every topic the policy forwards to for topic and group: the
// tiers in order, then the dead-letter topic: the topics the consumer creates.
func (p Policy) Topics(topic, group string) []string {
	return append(p.Tiers(topic, group), p.DLQ(topic, group))
}

// Next says where a record goes when it fails while at tier (0 = read from the
// original topic, n = read from retry tier n): retry tier tier+1 with that
// tier's delay, or, when the tiers are exhausted, the dead-letter topic with
// next = 0 and delay = 0. topic is the original topic.
func (p Policy) Next(topic, group string, tier int) (dest string, next int, delay time.Duration) {
	if tier < 0 {
		tier = 0
	}
	if tier < len(p.Delays) {
		return p.Tier(topic, group, tier+1), tier + 1, p.Delays[tier]
	}
	return p.DLQ(topic, group), 0, 0
}

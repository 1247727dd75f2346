package recovery

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/retrytopic"
)

// errInvalidPolicy prefixes every error New and Policy.ValidateNames
// return (the only errors they return).
var errInvalidPolicy = errors.New("recovery: invalid policy")

// Rule is one recoverability rule: the errors it applies to (Match) and what
// happens to a message that fails with one of them: how many handler
// attempts each delivery gets (Attempts) and how long the waits between them
// are (Backoff), which ladder of retry tiers it climbs (Tiers), and which
// dead-letter topic it ends in (DLQ).
//
// A zero Attempts, Backoff field, Tiers or DLQ takes the Fallback's value
// (the consumer's Config: today's behaviour), so a rule names only what
// differs.
type Rule struct {
	// Name labels the rule in Decisions, logs and errors, e.g. "fraud".
	// Default: "rule <index>".
	Name string

	// Match selects the errors the rule applies to. Required.
	Match Matcher

	// Attempts is how many times the handler is called for one delivery of
	// the message (at the source topic, and again in each retry tier) before
	// it moves on to the next tier or the dead-letter topic: 1 means no
	// in-process retry. Must be >= 0; 0 takes the Fallback's.
	Attempts int

	// Backoff shapes the in-process waits between those attempts. Zero fields
	// take the Fallback's.
	Backoff Backoff

	// Tiers is the ladder of retry tiers the message climbs once a delivery's
	// attempts are spent. nil takes the Fallback's (Config.Retry.Tiers);
	// &Ladder{} (no delays) means none: the dead-letter topic next.
	Tiers *Ladder

	// DLQ is the dead-letter topic, e.g. "payments.dlq.fraud": a legal Kafka
	// topic name. "" takes the Fallback's (Config.Retry.Tiers' dead-letter topic,
	// "<topic>.<group>.dlq" by default).
	DLQ string
}

// Ladder is a ladder of retry tiers of its own: a message on it waits
// Delays[n-1] in tier n (from the failure that sent it there, as in
// retrytopic.Policy.Delays). Its tier topics are
// "<topic>.<group>.retry.<Name>.<n>", so that two ladders never share a tier
// topic (a tier partition is read in due-time order only when every record in
// it has the same delay).
type Ladder struct {
	// Name names the ladder's tier topics: 1…249 characters of
	// [a-zA-Z0-9._-]. Required when Delays is not empty. Rules that name the
	// same ladder must give it the same Delays.
	Name string
	// Delays are the tiers' delays, each > 0 and at most half the tiers'
	// retention (Fallback.Retry.Retention). Empty: no tiers.
	Delays []time.Duration
}

// topic names tier n of the ladder.
func (l *Ladder) topic(topic, group string, n int) string {
	return topic + "." + group + ".retry." + l.Name + "." + strconv.Itoa(n)
}

// Fallback is what applies when no rule matches: the consumer's behaviour
// without rules. Its fields are the consumer's Config, defaults applied:
// Attempts = Config.Retry.Attempts, Backoff = Config.Retry.Backoff, Retry =
// Config.Retry.Tiers. It also gives every rule its zero fields.
type Fallback struct {
	// Attempts: handler calls per delivery, >= 1.
	Attempts int
	// Backoff between them; Base >= 0, Max >= Base.
	Backoff Backoff
	// Retry is the default ladder of tiers and the default dead-letter topic,
	// with the Retention and ReplicationFactor every ladder's topics get.
	Retry retrytopic.Policy
}

// Decision is what a Policy decided for one error.
type Decision struct {
	// Rule is the index of the matching rule in the rules given to New, or -1
	// for the Fallback.
	Rule int
	// Name is the rule's Name ("rule <index>" when unnamed), or "default".
	Name string
	// Attempts is the number of handler calls for one delivery, >= 1: the
	// consumer retries in process while the failed attempts of this delivery
	// are fewer.
	Attempts int
	// Backoff gives the wait before in-process retry n: Backoff.Delay(n, r).
	Backoff Backoff
	// Retry says where the message goes when the attempts are spent:
	// Retry.Next(topic, group, tier) gives the next tier of this decision's
	// ladder after tier (0 at the source) or, when its tiers are exhausted,
	// its dead-letter topic; Retry.DLQ(topic, group) is the dead-letter
	// topic of a failure that is not retried at all (a permanent one).
	Retry retrytopic.Policy
}

// Policy is a validated list of rules and its fallback. It is immutable and
// safe for concurrent use. Build it with New.
type Policy struct {
	rules    []Decision // one per rule, zero fields resolved
	matchers []Matcher
	fallback Decision
	ladders  []ladderInfo // the named ladders, in rule order, each once
}

type ladderInfo struct {
	ladder *Ladder
	rule   int // the first rule naming it
}

// New checks rules and the fallback and returns the Policy that decides by
// them. Rules are tried in order; the first whose Match matches decides, and
// the fallback decides when none does. With no rules every decision is the
// fallback's, which is the consumer's behaviour without rules: see Fallback.
//
// New reports every problem at once, each naming the rule's index (and name),
// all prefixed "recovery: invalid policy": a rule without a matcher or with a matcher
// built from bad arguments, negative Attempts, a bad Backoff, a ladder
// without a name or with bad delays, a ladder name given two sets of delays,
// an illegal DLQ topic name, and a fallback with Attempts < 1, a bad Backoff
// or a bad Retry policy.
func New(fallback Fallback, rules ...Rule) (*Policy, error) {
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{errInvalidPolicy}, args...)...))
	}
	retry := fallback.Retry.WithDefaults()
	if fallback.Attempts < 1 {
		fail("fallback: Attempts = %d, must be >= 1 (Config.Retry.Attempts)", fallback.Attempts)
	}
	if err := fallback.Backoff.check(); err != nil {
		fail("fallback: %v", err)
	}
	if err := retry.Validate(); err != nil {
		fail("fallback: Retry: %s", retryProblem(err))
	}
	p := &Policy{fallback: Decision{Rule: -1, Name: "default", Attempts: fallback.Attempts, Backoff: fallback.Backoff, Retry: retry}}
	byName := map[string]ladderInfo{}
	for i, r := range rules {
		where := fmt.Sprintf("rule %d", i)
		if r.Name != "" {
			where += fmt.Sprintf(" (%q)", r.Name)
		} else {
			r.Name = where
		}
		if err := r.Match.check(); err != nil {
			fail("%s: Match %v", where, err)
		}
		if r.Attempts < 0 {
			fail("%s: Attempts = %d, must be >= 1 (or 0: the fallback's, %d)", where, r.Attempts, fallback.Attempts)
		}
		if r.Attempts == 0 {
			r.Attempts = fallback.Attempts
		}
		r.Backoff = r.Backoff.or(fallback.Backoff)
		if err := r.Backoff.check(); err != nil {
			fail("%s: %v", where, err)
		}
		pol := retry
		if l := r.Tiers; l != nil {
			pol.Delays = slices.Clone(l.Delays)
			pol.TierTopic = nil
			if len(l.Delays) > 0 {
				l := &Ladder{Name: l.Name, Delays: slices.Clone(l.Delays)}
				pol.TierTopic = l.topic
				switch prev, seen := byName[l.Name]; {
				case l.Name == "":
					fail("%s: Tiers has delays %v but no Name: a ladder of its own needs a name for its tier topics", where, l.Delays)
				case seen && !slices.Equal(prev.ladder.Delays, l.Delays):
					fail("%s: Tiers %q has delays %v, but rule %d gave it %v: a ladder's tier topics have one set of delays", where, l.Name, l.Delays, prev.rule, prev.ladder.Delays)
				case !seen:
					byName[l.Name] = ladderInfo{l, i}
					p.ladders = append(p.ladders, ladderInfo{l, i})
				}
			}
		}
		if r.DLQ != "" {
			dlq := r.DLQ
			pol.DLQTopic = func(string, string) string { return dlq }
		}
		if err := pol.Validate(); err != nil {
			fail("%s: %s", where, retryProblem(err))
		}
		p.rules = append(p.rules, Decision{Rule: i, Name: r.Name, Attempts: r.Attempts, Backoff: r.Backoff, Retry: pol})
		p.matchers = append(p.matchers, r.Match)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// Decide returns the decision of the first rule that matches err, or the
// fallback's when none does (and for a nil err). It is a pure function of err:
// the consumer calls it after each failed attempt with the error as
// classified (so an SQL data error arrives marked handler.Permanent).
//
// A decision chooses the budget and the destinations; it does not change
// whether a failure is retried at all. An outage or an open breaker is
// waited out before any rule is asked, and a permanent failure (permanent,
// decode, missing or invalid key, a panic unless Config.Retry.Panics) goes to
// the decision's dead-letter topic at once, whatever its Attempts and Tiers.
//
// The Decision is the caller's: changing it (its Retry.Delays) changes
// nothing in the Policy.
func (p *Policy) Decide(err error) Decision {
	if err != nil {
		for i, m := range p.matchers {
			if m.Match(err) {
				return p.rules[i].clone()
			}
		}
	}
	return p.fallback.clone()
}

// Fallback returns the decision made when no rule matches.
func (p *Policy) Fallback() Decision { return p.fallback.clone() }

// clone returns d with its own copy of Retry.Delays.
func (d Decision) clone() Decision {
	d.Retry.Delays = slices.Clone(d.Retry.Delays)
	return d
}

// Retries returns every distinct retrytopic.Policy a decision may carry, the
// fallback's first: what the consumer creates topics for
// (internal/forward.EnsureTopicsFor) and reads tiers of.
func (p *Policy) Retries(topic, group string) []retrytopic.Policy {
	out := []retrytopic.Policy{p.fallback.Retry}
	seen := map[string]bool{signature(p.fallback.Retry, topic, group): true}
	for _, d := range p.rules {
		if s := signature(d.Retry, topic, group); !seen[s] {
			seen[s] = true
			out = append(out, d.Retry)
		}
	}
	return out
}

// signature identifies a policy's topics for topic and group.
func signature(pol retrytopic.Policy, topic, group string) string {
	return fmt.Sprint(pol.Topics(topic, group), pol.Delays)
}

// TierTopics returns the tier topics of every ladder for topic and group:
// the fallback's tiers in order, then each named ladder's. The consumer reads
// all of them.
func (p *Policy) TierTopics(topic, group string) []string {
	out := p.fallback.Retry.Tiers(topic, group)
	for _, l := range p.ladders {
		for n := range l.ladder.Delays {
			out = append(out, l.ladder.topic(topic, group, n+1))
		}
	}
	return out
}

// DLQTopics returns every dead-letter topic of topic for group, the
// fallback's first, each once.
func (p *Policy) DLQTopics(topic, group string) []string {
	out := []string{p.fallback.Retry.DLQ(topic, group)}
	for _, d := range p.rules {
		if name := d.Retry.DLQ(topic, group); !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// Tier locates a tier topic of topic and group: its tier number n (1-based)
// and the delay of that tier on its ladder. ok is false when name is none of
// the tier topics (TierTopics).
func (p *Policy) Tier(topic, group, name string) (n int, delay time.Duration, ok bool) {
	for i, t := range p.fallback.Retry.Tiers(topic, group) {
		if t == name {
			return i + 1, p.fallback.Retry.Delays[i], true
		}
	}
	for _, l := range p.ladders {
		for i, d := range l.ladder.Delays {
			if l.ladder.topic(topic, group, i+1) == name {
				return i + 1, d, true
			}
		}
	}
	return 0, 0, false
}

// ValidateNames checks the names that topic and group give: every tier topic
// of every ladder and every dead-letter topic is a legal Kafka topic name,
// none is topic itself, and no tier topic is also a dead-letter topic or a
// tier of another ladder. The consumer calls it for each of its topics at
// start. Errors start "recovery: invalid policy".
func (p *Policy) ValidateNames(topic, group string) error {
	var errs []error
	for _, d := range append([]Decision{p.fallback}, p.rules...) {
		if err := d.Retry.ValidateNames(topic, group); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %s", errInvalidPolicy, d.Name, retryProblem(err)))
		}
	}
	tiers := map[string]bool{}
	for _, t := range p.TierTopics(topic, group) {
		if tiers[t] {
			errs = append(errs, fmt.Errorf("%w: tier topic %q of topic %q group %q belongs to two ladders", errInvalidPolicy, t, topic, group))
		}
		tiers[t] = true
	}
	for _, dlq := range p.DLQTopics(topic, group) {
		if tiers[dlq] {
			errs = append(errs, fmt.Errorf("%w: dead-letter topic %q of topic %q group %q is also a retry tier", errInvalidPolicy, dlq, topic, group))
		}
	}
	return errors.Join(errs...)
}

// retryProblem returns the text of a retrytopic.Policy validation error
// without its "retrytopic: invalid policy: " prefixes, its problems on one
// line separated by "; ".
func retryProblem(err error) string {
	text := strings.ReplaceAll(err.Error(), retrytopic.ErrInvalidPolicy.Error()+": ", "")
	return strings.ReplaceAll(text, "\n", "; ")
}

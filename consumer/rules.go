package consumer

import (
	"fmt"
	"strings"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// RetryConfig is Config.Retry: how a message whose handler returned a
// retriable error is tried again. Permanent errors, decode errors, missing
// keys and (unless Panics) panics go to the dead-letter topic at once.
type RetryConfig struct {
	// Attempts is how many times the handler is called for one delivery of
	// a message that keeps failing with a retriable error, each call in a
	// fresh transaction: at the source topic, and again in each retry tier.
	// After them the message is forwarded to the next tier of Tiers, or after
	// the last tier to the dead-letter topic, so an always failing message is
	// handled Attempts × (1 + len(Tiers.Delays)) times in all (package doc,
	// "Attempts per message"). 1 means no in-process retries; a negative value is an error.
	// Default: 4 (three in-process retries).
	Attempts int

	// Backoff shapes the waits between in-process attempts: retry n waits a
	// uniformly random time in [0, min(Max, Base*2^(n-1))] ("full jitter"),
	// or at least the delay asked by handler.RetryAfter (one longer than Max
	// sends the message to its retry tier instead, when there are tiers).
	// A zero Base or Max takes its default.
	// Default: {Base: 100ms, Max: 5s}.
	Backoff recovery.Backoff

	// Panics treats a handler panic like a retriable error instead of
	// dead-lettering it at once.
	// Default: false.
	Panics bool

	// Tiers says where a message goes when its in-process attempts are
	// spent: through non-blocking retry topics, one per entry of
	// Tiers.Delays, then to the dead-letter topic (Tiers.DLQ). idem creates
	// missing tier and dead-letter topics at start (with at least the
	// source's partitions) and subscribes to the tiers itself.
	// Tiers.Retention is those topics' retention.ms.
	// Default: retrytopic.Policy{} (no tiers; dead-letter topic "<topic>.<group>.dlq").
	Tiers retrytopic.Policy

	// Rules choose, by the error, how a failed message is retried: each
	// rule's Match (errors.Is/As, kind, SQLSTATE class, HTTP status) picks
	// its attempts per delivery, backoff, retry-tier ladder and dead-letter
	// topic (e.g. fraud declines to "payments.dlq.fraud"). Rules are
	// matched in order against the error the handler returned; the first
	// match wins, and an error no rule matches takes the fallback rule the
	// other fields make (Attempts, Backoff, Tiers). A rule's zero fields
	// take the fallback's. A rule never makes a permanent error retriable:
	// it only chooses its dead-letter topic. Validated at start (a rule
	// without a Match is an error). See package recovery.
	// Default: nil (every error takes the fallback rule).
	Rules []recovery.Rule
}

// recovery is c's recoverability policy: Config.Retry.Rules, matched in order,
// over the fallback rule Config.Retry makes
// (today's behaviour when Rules is empty). c has its defaults applied.
func (c Config) recovery() (*recovery.Policy, error) {
	return recovery.New(recovery.Fallback{
		Attempts: c.Retry.Attempts,
		Backoff:  c.Retry.Backoff,
		Retry:    c.Retry.Tiers,
	}, c.Retry.Rules...)
}

// dlqTopics is every dead-letter topic of source topic t: the fallback's
// and each rule's, of every route, once each. c has its defaults applied.
func (c Config) dlqTopics(t string) []string {
	// The fallback's first, also when the rules do not build (Validate reports them).
	return c.topicsOf(t, []string{c.Retry.Tiers.DLQ(t, c.Group)}, (*recovery.Policy).DLQTopics)
}

// rules checks Config.Retry.Rules (errs records each problem, naming
// the rule): matchers, attempts, backoffs, ladders and topic names. Called only
// once the fallback's own fields passed (recovery.New checks them again).
func (c configCheck) rules() {
	p, err := c.recovery()
	if err != nil {
		badEach(c.errs, "Retry.Rules", err)
		return
	}
	for _, t := range c.Topics {
		if t == "" || c.Group == "" {
			continue
		}
		if err := p.ValidateNames(t, c.Group); err != nil {
			c.errs.Bad("Retry.Rules", t, err.Error())
		}
	}
	if c.Ordering.keyed {
		for i, r := range c.Retry.Rules {
			if r.Tiers != nil && len(r.Tiers.Delays) > 0 {
				c.errs.Bad("Retry.Rules", i, "a rule with a tier ladder of its own (Tiers with Delays) is not supported with Ordering ByKey: a parked head is re-sent to Retry.Tiers")
			}
		}
	}
}

// retryWait decides whether a retriable err, after retries in-process
// retries of this delivery, gets one more (again) and how long to wait
// first, by the rule err matches: its Attempts and Backoff, and a
// handler.RetryAfter longer than its Backoff.Max goes to the rule's retry
// tier instead of holding the partition (when it has tiers). name is the
// rule's, for logs. wait is the runner's source of jitter.
func (rt *route) retryWait(err error, retries int, wait *delays) (d time.Duration, again bool, name string) {
	dec := rt.rules.Decide(err) // the route's rules
	if retries+1 >= dec.Attempts {
		return 0, false, dec.Name
	}
	d = wait.backoff(dec.Backoff, retries+1)
	if ra, ok := handler.RetryAfterOf(err); ok && ra > d {
		if ra > dec.Backoff.Max && len(dec.Retry.Delays) > 0 {
			// Too long to hold the partition: the retry tier honours it
			// (capped at its delay) without blocking later messages.
			return 0, false, dec.Name
		}
		d = ra
	}
	return d, true, dec.Name
}

// backoff is b's full-jitter delay before retry n, from d's random source.
func (d *delays) backoff(b recovery.Backoff, n int) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return b.Delay(n, d.rand)
}

// retry checks Config.Retry: the fallback rule's own fields first,
// then its Rules once those passed.
func (c configCheck) retry() {
	if c.Retry.Attempts < 1 {
		c.errs.Bad("Retry.Attempts", c.Retry.Attempts, "must be >= 1 (1: no in-process retries; 0: the default, 4)")
	}
	if err := c.Retry.Tiers.Validate(); err != nil {
		c.errs.Bad("Retry.Tiers", c.Retry.Tiers.Delays, err.Error())
	}
	for _, t := range c.Topics {
		if t == "" {
			continue
		}
		if err := c.Retry.Tiers.ValidateNames(t, c.Group); err != nil && strings.TrimSpace(c.Group) != "" {
			c.errs.Bad("Retry.Tiers", t, err.Error())
		}
	}
	if c.Retry.Backoff.Base < 0 {
		c.errs.Bad("Retry.Backoff.Base", c.Retry.Backoff.Base, "must be > 0")
	}
	if c.Retry.Backoff.Max < c.Retry.Backoff.Base {
		c.errs.Bad("Retry.Backoff.Max", c.Retry.Backoff.Max, fmt.Sprintf("must be >= Retry.Backoff.Base (%s)", c.Retry.Backoff.Base))
	} else if len(c.Retry.Rules) > 0 && c.Retry.Tiers.Validate() == nil && c.Retry.Backoff.Base >= 0 && c.Retry.Attempts >= 1 {
		c.rules() // only once the fallback's own fields passed: recovery.New checks them again
	}
}

package consumer

import (
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/recovery"
)

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

// validateRules checks Config.Retry.Rules (errs records each problem, naming
// the rule): matchers, attempts, backoffs, ladders and topic names. Called only
// once the fallback's own fields passed (recovery.New checks them again).
func (c Config) validateRules(errs *configerr.List) {
	p, err := c.recovery()
	if err != nil {
		badEach(errs, "Retry.Rules", err)
		return
	}
	for _, t := range c.Topics {
		if t == "" || c.Group == "" {
			continue
		}
		if err := p.ValidateNames(t, c.Group); err != nil {
			errs.Bad("Retry.Rules", t, err.Error())
		}
	}
	if c.Ordering.keyed {
		for i, r := range c.Retry.Rules {
			if r.Tiers != nil && len(r.Tiers.Delays) > 0 {
				errs.Bad("Retry.Rules", i, "a rule with a tier ladder of its own (Tiers with Delays) is not supported with Ordering ByKey: a parked head is re-sent to Retry.Tiers")
			}
		}
	}
}

// retryWait decides whether a retriable err, after retries in-process
// retries of this delivery, gets one more (again) and how long to wait
// first, by the rule err matches: its Attempts and Backoff, and a
// handler.RetryAfter longer than its Backoff.Max goes to the rule's retry
// tier instead of holding the partition (when it has tiers). name is the
// rule's, for logs.
func (w *worker) retryWait(err error, retries int) (d time.Duration, again bool, name string) {
	dec := w.rt.rules.Decide(err) // the route's rules
	if retries+1 >= dec.Attempts {
		return 0, false, dec.Name
	}
	d = w.r.wait.backoff(dec.Backoff, retries+1)
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

package consumer

import (
	"fmt"
	"slices"
	"strings"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/recovery"
)

// routes checks Config.Routes, TypeOf, Unmatched and Filter (c has
// its defaults applied): every problem names the route and its field.
func (c configCheck) routes() {
	if c.Unmatched != UnmatchedDeadLetter && c.Unmatched != UnmatchedSkip {
		c.errs.Bad("Unmatched", c.Unmatched, "unknown policy")
	}
	if c.TypeHeader != "" && c.TypeOf != nil {
		c.errs.Bad("TypeHeader", c.TypeHeader, "set TypeHeader or TypeOf, not both: they name the same thing")
	}
	names := map[string]int{}
	for i, r := range c.Routes {
		where := fmt.Sprintf("Routes[%d]", i)
		if r.Name != "" {
			where = fmt.Sprintf("Routes[%q]", r.Name)
		}
		switch prev, dup := names[r.Name]; {
		case r.Name == "":
			c.errs.Bad(where+".Name", r.Name, "a route needs a name (the route label of the metrics)")
		case dup:
			c.errs.Bad(where+".Name", r.Name, fmt.Sprintf("Routes[%d] has it too: names are unique", prev))
		case r.Name == defaultRoute:
			c.errs.Bad(where+".Name", r.Name, `"default" names the handler given to Run`)
		case len(r.Name) > 64 || strings.Trim(r.Name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "":
			c.errs.Bad(where+".Name", r.Name, "must be 1 to 64 characters of [a-zA-Z0-9._-]")
		}
		names[r.Name] = i
		if f, ok := r.Handler.(handler.Func); r.Handler == nil || ok && f == nil {
			c.errs.Bad(where+".Handler", nil, "a route needs a handler (handler.Batch(nil) and a nil handler.Func are nil)")
		}
		for j, t := range r.Topics {
			switch {
			case !slices.Contains(c.Topics, t):
				c.errs.Bad(where+".Topics", t, "not in Config.Topics: a route takes messages of the topics Run consumes")
			case slices.Contains(r.Topics[:j], t):
				c.errs.Bad(where+".Topics", t, "listed twice")
			}
		}
		for j, typ := range r.Types {
			switch {
			case typ == "":
				c.errs.Bad(where+".Types", r.Types, "types must not be empty")
			case slices.Contains(r.Types[:j], typ):
				c.errs.Bad(where+".Types", typ, "listed twice")
			}
		}
		if len(r.Types) > 0 && c.TypeOf == nil && c.TypeHeader == "" {
			c.errs.Bad(where+".Types", r.Types, `routing by type needs Config.TypeHeader (e.g. "ce_type") or Config.TypeOf (e.g. a serde.Registry's RecordName)`)
		}
		if by := c.shadowedBy(i); by >= 0 {
			c.errs.Bad(where, r.Name, fmt.Sprintf("is never reached: Routes[%d] (%q) comes first and takes every message it would", by, c.Routes[by].Name))
		}
		c.routePolicies(where, r)
	}
	c.routeTopics()
}

// shadowedBy returns the index of an earlier route that takes every
// message route i would (all of its topics, and all of its types), or -1.
func (c Config) shadowedBy(i int) int {
	r := c.Routes[i]
	topics := r.Topics
	if len(topics) == 0 {
		topics = c.Topics
	}
	for j, e := range c.Routes[:i] {
		covers := true
		for _, t := range topics {
			if len(e.Topics) > 0 && !slices.Contains(e.Topics, t) {
				covers = false
			}
		}
		for _, typ := range r.Types {
			if len(e.Types) > 0 && !slices.Contains(e.Types, typ) {
				covers = false
			}
		}
		if len(r.Types) == 0 && len(e.Types) > 0 {
			covers = false
		}
		if covers {
			return j
		}
	}
	return -1
}

// routePolicies checks the route's own Retry, Expiry and Batch as
// Validate checks the Config's, and reports their problems under where.
func (c configCheck) routePolicies(where string, r Route) {
	if r.Retry == nil && r.Expiry == nil && r.Batch == nil && !r.OwnTopics {
		return
	}
	mc := c.Config
	mc.Routes, mc.TypeOf = nil, nil
	if len(r.Topics) > 0 {
		mc.Topics = r.Topics
	}
	mc.Retry = c.routeRetry(r)
	mc.Expiry = routeExpiry(c.Config, r)
	mc.Batch = routeBatch(c.Config, r)
	own := map[string]bool{"Retry": r.Retry != nil || r.OwnTopics, "Expiry": r.Expiry != nil, "Batch": r.Batch != nil}
	for _, e := range configErrorsOf(mc.Validate()) {
		field := strings.TrimPrefix(e.Field, "Config.")
		group, _, _ := strings.Cut(field, ".")
		if !own[group] {
			continue // the Config's own: reported for Config
		}
		e.Field = "Config." + where + "." + field
		c.errs.Add(e)
	}
	if _, swept := c.Dedupe.(sweepable); swept && !c.Retention.NoSweep && r.Retry != nil {
		if keep, tiers := inboxRetention(c.Config), mc.Retry.Tiers.WithDefaults().Retention; keep < tiers {
			c.errs.Bad(where+".Retry.Tiers.Retention", tiers, fmt.Sprintf("must be at most Retention.Keep (%s): a record may wait that long in the route's retry tiers or dead-letter topic, and a copy of a message handled meanwhile must still find its key", keep))
		}
	}
}

// configErrorsOf returns the *configerr.Error problems joined in err.
func configErrorsOf(err error) []*configerr.Error {
	var out []*configerr.Error
	var walk func(error)
	walk = func(err error) {
		if ce, ok := err.(*configerr.Error); ok {
			cp := *ce
			out = append(out, &cp)
			return
		}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
		}
	}
	walk(err)
	return out
}

// routeTopics checks the tier and dead-letter topics of each source
// topic across its routes: one tier topic has one ladder of delays (a tier
// partition is read in due-time order), and no tier topic is a dead-letter
// topic.
func (c configCheck) routeTopics() {
	if len(c.Routes) == 0 || strings.TrimSpace(c.Group) == "" {
		return
	}
	type use struct {
		who    string
		delays string
	}
	for _, t := range c.Topics {
		tiers := map[string]use{}
		dlqs := map[string]string{}
		check := func(who string, p *recovery.Policy) {
			for _, name := range p.TierTopics(t, c.Group) {
				n, d, _ := p.Tier(t, c.Group, name)
				u := use{who, fmt.Sprintf("tier %d, %s", n, d)}
				if prev, ok := tiers[name]; ok && prev.delays != u.delays {
					c.errs.Bad("Routes", name, fmt.Sprintf("the retry tier topic of %s (%s) and of %s (%s): one tier topic has one delay; give a route topics of its own (Route.OwnTopics, or Retry.Tiers.TierTopic)", prev.who, prev.delays, who, u.delays))
				} else if !ok {
					tiers[name] = u
				}
			}
			for _, name := range p.DLQTopics(t, c.Group) {
				dlqs[name] = who
			}
		}
		if p, err := c.recovery(); err == nil {
			check("Config.Retry", p)
		}
		for i, r := range c.Routes {
			if r.Retry == nil && !r.OwnTopics || len(r.Topics) > 0 && !slices.Contains(r.Topics, t) {
				continue
			}
			if p, err := c.withRetry(c.routeRetry(r)).recovery(); err == nil {
				check(fmt.Sprintf("Routes[%d] (%q)", i, r.Name), p)
			}
		}
		for name, who := range dlqs {
			if u, ok := tiers[name]; ok {
				c.errs.Bad("Routes", name, fmt.Sprintf("the dead-letter topic of %s is a retry tier topic of %s", who, u.who))
			}
		}
	}
}

package consumer

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/configerr"
	"github.com/idemhq/idem/recovery"
	"github.com/idemhq/idem/retrytopic"
)

// Route is one of several handlers of one Run (Config.Routes): the messages
// it takes, by topic and by type, and the policies it handles them with:
// its own KeyFunc, Retry (rules and tiers, its own dead-letter topic when it
// asks), Expiry and Batch. A field left zero takes the Config's.
//
// Each message goes to the first route, in Config.Routes' order, that takes
// its topic (Topics) and its type (Types, as Config.TypeOf names it); the
// handler given to Run, if any, is the default route and takes the rest,
// with the Config's own policies, under the name "default". Without it a
// message no route takes follows Config.Unmatched. A record read back from a
// retry tier or the deferred topic is routed by its first topic
// (handler.Message.Origin) and its type again, so it comes back to its
// route. See docs/routes.md.
type Route struct {
	// Name names the route: the value of the route label of idem's
	// metrics, and in logs and errors. 1 to 64 characters of
	// [a-zA-Z0-9._-], unique among the routes, not "default" (the
	// handler given to Run). Required.
	Name string

	// Topics are the topics of Config.Topics whose messages the route
	// takes.
	// Default: nil (every topic of Config.Topics).
	Topics []string

	// Types are the types of message the route takes, as
	// Config.TypeHeader or Config.TypeOf names them (CloudEvents' ce_type,
	// a schema's record name or subject), matched exactly.
	// Default: nil (every type).
	Types []string

	// Handler handles the route's messages, with the contract of Run's
	// handler: a batch handler (handler.Batch, handler.TypedBatch) gets
	// them in batches (Batch.MaxMessages 500 unless set). Required.
	Handler handler.Handler

	// KeyFunc derives the idempotency key of the route's messages.
	// Default: nil (Config.KeyFunc).
	KeyFunc KeyFunc

	// Retry is how the route's failed messages are tried again, as
	// Config.Retry says for Run's handler: attempts, backoff, retry tiers,
	// dead-letter topic, rules. Set, it replaces Config.Retry whole for the
	// route (its zero fields take RetryConfig's defaults). Its topics are
	// named after the source topic and the group, as without routes
	// ("<topic>.<group>.retry.<n>", "<topic>.<group>.dlq"), unless it names
	// its own (Tiers.TierTopic, Tiers.DLQTopic, OwnTopics): routes of one
	// topic that give one tier topic two ladders of delays are a Validate
	// error, since a tier partition is read in due-time order.
	// Default: nil (Config.Retry).
	Retry *RetryConfig

	// OwnTopics names the route's retry tiers and dead-letter topic after
	// the route, "<topic>.<group>.<Name>.retry.<n>" and
	// "<topic>.<group>.<Name>.dlq", where Retry.Tiers does not name them,
	// so that its failures are kept apart from the other routes' of the
	// topic. A topic's names never depend on the other routes: adding a
	// route later renames nothing.
	// Default: false (the names Config.Retry.Tiers gives the topic).
	OwnTopics bool

	// Expiry says when the route's messages are too old to handle, as
	// Config.Expiry does. Set, it replaces Config.Expiry whole for the
	// route.
	// Default: nil (Config.Expiry).
	Expiry *Expiry

	// Batch groups the route's messages into transactions, as
	// Config.Batch does; a batch holds the messages of one route only.
	// Set, it replaces Config.Batch whole for the route.
	// Default: nil (Config.Batch; with a batch handler and Config.Batch.MaxMessages 0, MaxMessages 500).
	Batch *BatchConfig
}

// UnmatchedPolicy says what happens to a message no route takes
// (Config.Unmatched).
type UnmatchedPolicy int

const (
	// UnmatchedDeadLetter sends the message to the dead-letter topic of
	// Config.Retry, with idem-error-kind "permanent" and an idem-error
	// naming its topic and type. The default: a message nobody handles is
	// work for an operator (who replays it once a route takes it).
	UnmatchedDeadLetter UnmatchedPolicy = iota
	// UnmatchedSkip skips the message: no inbox row, no transaction, no
	// forward; its offset commits and it is counted
	// (idem_unmatched_total{action="skipped"}).
	UnmatchedSkip
)

// String returns "dead-letter" or "skip".
func (p UnmatchedPolicy) String() string {
	switch p {
	case UnmatchedDeadLetter:
		return "dead-letter"
	case UnmatchedSkip:
		return "skip"
	}
	return fmt.Sprintf("UnmatchedPolicy(%d)", int(p))
}

// defaultRoute is the name of the route of the handler given to Run.
const defaultRoute = "default"

// route is a route as Run runs it: a Route (or Run's handler, or the
// policies of the messages no route takes) with every policy resolved.
type route struct {
	idx     int    // in routeTable.all, and in a claim's metrics
	name    string // the route label; "" for the messages no route takes
	h       handler.Handler
	bh      handler.BatchHandler // h as a batch handler; nil for another
	keyFunc KeyFunc
	retry   RetryConfig      // defaults applied, names resolved (OwnTopics)
	rules   *recovery.Policy // retry's rules over its fallback
	expiry  Expiry
	batch   BatchConfig
}

// routeTable picks the route of each message. It is immutable once made.
type routeTable struct {
	all  []*route // Config.Routes in order, then the default (Run's handler, if any), then none
	def  *route   // Run's handler; nil without one
	none *route   // the messages no route takes: Config's policies, name ""
	// only is the one route of a Run without Config.Routes: no lookup.
	only *route
	// topics are the routes of each source topic: a short list is
	// scanned (faster than hashing the name), a long one mapped.
	topics     []topicEntry
	topicMap   map[string]*topicRoutes
	typeHeader string
	typeOf     KeyFunc
	unmatched  UnmatchedPolicy
	filter     func(m *handler.Message) string
	batches    bool // some route batches (its BatchConfig.MaxMessages > 1)
	// ladders are, per source topic, the recovery policies of its routes:
	// where its tier topics' numbers and delays are found.
	ladders map[string][]*recovery.Policy
}

// topicEntry is a source topic and its routes.
type topicEntry struct {
	topic string
	tr    *topicRoutes
}

// shortList is the most entries looked up by a scan rather than a map.
const shortList = 8

// topicRoutes are the routes of one source topic.
type topicRoutes struct {
	// types are the types listed by the routes that come before the
	// first route taking every type, each with the first route listing
	// it; typeMap holds them too when there are more than shortList.
	types   []typeEntry
	typeMap map[string]*route
	// rest takes what types do not: the first route taking every type,
	// else the default; nil: unmatched.
	rest *route
}

// typeEntry is a type and the route that takes it.
type typeEntry struct {
	typ string
	rt  *route
}

// byType returns the route of type typ, or nil. typ is compared without
// being copied (a header's value).
func (tr *topicRoutes) byType(typ []byte) *route {
	if tr.typeMap != nil {
		return tr.typeMap[string(typ)]
	}
	for i := range tr.types {
		if tr.types[i].typ == string(typ) {
			return tr.types[i].rt
		}
	}
	return nil
}

// newRouteTable resolves cfg's routes (cfg has its defaults applied and is
// valid) with h, Run's handler (nil: no default route), and rules, its
// recovery policy.
func newRouteTable(cfg Config, h handler.Handler, rules *recovery.Policy) (*routeTable, error) {
	t := &routeTable{typeHeader: cfg.TypeHeader, typeOf: cfg.TypeOf, unmatched: cfg.Unmatched,
		filter: cfg.Filter, ladders: map[string][]*recovery.Policy{}}
	add := func(name string, h handler.Handler, kf KeyFunc, retry RetryConfig, rules *recovery.Policy, exp Expiry, b BatchConfig) *route {
		rt := &route{idx: len(t.all), name: name, keyFunc: kf, retry: retry, rules: rules, expiry: exp, batch: b}
		if h != nil {
			rt.h = wrap(h) // the correlation id in ctx, panics recovered (correlation.go)
			rt.bh, _ = h.(handler.BatchHandler)
		}
		t.batches = t.batches || b.MaxMessages > 1
		t.all = append(t.all, rt)
		return rt
	}
	for _, r := range cfg.Routes {
		retry := cfg.routeRetry(r)
		rrules, err := cfg.withRetry(retry).recovery()
		if err != nil {
			return nil, fmt.Errorf("consumer: route %q: rules: %w", r.Name, err)
		}
		add(r.Name, r.Handler, orKeyFunc(r.KeyFunc, cfg.KeyFunc), retry, rrules, routeExpiry(cfg, r), routeBatch(cfg, r))
	}
	if h != nil { // a batch handler batches: Config.Batch, its MaxMessages 500 when left 0
		t.def = add(defaultRoute, h, cfg.KeyFunc, cfg.Retry, rules, cfg.Expiry, routeBatch(cfg, Route{Handler: h}))
	}
	t.none = add("", nil, cfg.KeyFunc, cfg.Retry, rules, cfg.Expiry, BatchConfig{MaxMessages: 1})
	if len(cfg.Routes) == 0 {
		t.only = t.def
	}
	for _, topic := range cfg.Topics {
		tr := &topicRoutes{}
		for i, r := range cfg.Routes {
			if len(r.Topics) > 0 && !slices.Contains(r.Topics, topic) {
				continue
			}
			if len(r.Types) == 0 {
				tr.rest = t.all[i]
				break
			}
			for _, typ := range r.Types {
				if tr.byType([]byte(typ)) == nil {
					tr.types = append(tr.types, typeEntry{typ, t.all[i]})
				}
			}
		}
		if len(tr.types) > shortList {
			tr.typeMap = map[string]*route{}
			for _, e := range tr.types {
				tr.typeMap[e.typ] = e.rt
			}
		}
		if tr.rest == nil {
			tr.rest = t.def
		}
		t.topics = append(t.topics, topicEntry{topic, tr})
		if len(t.topics) > shortList {
			t.topicMap = map[string]*topicRoutes{}
			for _, e := range t.topics {
				t.topicMap[e.topic] = e.tr
			}
		}
		for _, rt := range t.all {
			if !slices.ContainsFunc(t.ladders[topic], func(p *recovery.Policy) bool { return p == rt.rules }) {
				t.ladders[topic] = append(t.ladders[topic], rt.rules)
			}
		}
	}
	return t, nil
}

// names returns the routes' names, for the start's log: "default" for
// Run's handler alone.
func (t *routeTable) names() []string {
	var out []string
	for _, rt := range t.all {
		if rt != t.none {
			out = append(out, rt.name)
		}
	}
	return out
}

// expiryOf is the Expiry of the route named name: the default route's
// (Config.Expiry) for "" or a name no route has. An owed OnExpired call
// (settle.go) keeps its route's name.
func (t *routeTable) expiryOf(name string) Expiry {
	for _, rt := range t.all {
		if rt.name == name && rt != t.none {
			return rt.expiry
		}
	}
	return t.none.expiry
}

// onExpired reports whether some route has an Expiry.OnExpired.
func (t *routeTable) onExpired() bool {
	for _, rt := range t.all {
		if rt.expiry.OnExpired != nil {
			return true
		}
	}
	return false
}

// orKeyFunc returns a, or b when a is nil.
func orKeyFunc(a, b KeyFunc) KeyFunc {
	if a != nil {
		return a
	}
	return b
}

// routesOf returns the routes of source topic topic, or nil.
func (t *routeTable) routesOf(topic string) *topicRoutes {
	if t.topicMap != nil {
		return t.topicMap[topic]
	}
	for i := range t.topics {
		if t.topics[i].topic == topic {
			return t.topics[i].tr
		}
	}
	return nil
}

// lookup returns the route of msg: by msg.Origin().Topic, and, when a route
// of that topic lists types, by its type (Config.TypeHeader's value, or
// what Config.TypeOf names). nil: no route takes it (Config.Unmatched), and
// typ is its type when it has one. err is TypeOf's: one marked
// handler.Decode or an open breaker (rt nil then: the message
// dead-letters, or waits); any other error is a type no route lists, and
// err says why. A lookup by header allocates nothing.
func (t *routeTable) lookup(msg *handler.Message) (rt *route, typ string, err error) {
	if t.only != nil {
		return t.only, "", nil
	}
	topic := msg.Original.Topic
	if topic == "" {
		topic = msg.Topic
	}
	tr := t.routesOf(topic)
	if tr == nil {
		return t.def, "", nil // not a topic of Config.Topics: only Config.Topics are read
	}
	if len(tr.types) == 0 {
		return tr.rest, "", nil
	}
	if t.typeHeader != "" {
		v, ok := msg.Header(t.typeHeader)
		if rt := tr.byType(v); ok && rt != nil {
			return rt, "", nil
		} else if tr.rest == nil {
			return nil, string(v), nil // unmatched: its type for the dead letter
		}
		return tr.rest, "", nil
	}
	typ, err = callKeyFunc(t.typeOf, msg)
	if err != nil {
		if handler.IsDecode(err) || breaker.IsOpen(err) {
			return nil, "", err
		}
		return tr.rest, "", err
	}
	if rt := tr.byType([]byte(typ)); rt != nil {
		return rt, typ, nil
	}
	return tr.rest, typ, nil
}

// tierOf locates tier topic name of source topic on any of its routes'
// ladders (recovery.Policy.Tier).
func (t *routeTable) tierOf(topic, group, name string) (n int, delay time.Duration, ok bool) {
	for _, p := range t.ladders[topic] {
		if n, d, ok := p.Tier(topic, group, name); ok {
			return n, d, true
		}
	}
	return 0, 0, false
}

// routeRetry is r's RetryConfig with its defaults applied and, with
// OwnTopics, the route's topic names where it names none. c has its
// defaults applied.
func (c Config) routeRetry(r Route) RetryConfig {
	retry := c.Retry
	if r.Retry != nil {
		retry = Config{Retry: *r.Retry}.withDefaults().Retry
	}
	if r.OwnTopics {
		name := r.Name
		if retry.Tiers.TierTopic == nil {
			retry.Tiers.TierTopic = func(topic, group string, n int) string {
				return fmt.Sprintf("%s.%s.%s.retry.%d", topic, group, name, n)
			}
		}
		if retry.Tiers.DLQTopic == nil {
			retry.Tiers.DLQTopic = func(topic, group string) string { return topic + "." + group + "." + name + ".dlq" }
		}
	}
	return retry
}

// withRetry returns c with Retry replaced.
func (c Config) withRetry(retry RetryConfig) Config {
	c.Retry = retry
	return c
}

// routeExpiry is r's Expiry, defaults applied.
func routeExpiry(c Config, r Route) Expiry {
	if r.Expiry == nil {
		return c.Expiry
	}
	return Config{Expiry: *r.Expiry}.withDefaults().Expiry
}

// routeBatch is r's BatchConfig, defaults applied: a batch handler's
// MaxMessages, left 0, is batchHandlerMaxMessages.
func routeBatch(c Config, r Route) BatchConfig {
	b := c.Batch
	if r.Batch != nil {
		b = Config{Batch: *r.Batch}.withDefaults().Batch
	}
	if _, ok := r.Handler.(handler.BatchHandler); ok && b.MaxMessages == 0 {
		b.MaxMessages = batchHandlerMaxMessages
	}
	return b
}

// retryPolicies returns the recovery policies of the routes that take
// source topic t: Config.Retry's first (Run's handler's, the unmatched
// messages', and every route's without a Retry of its own), then each
// other, once each. c has its defaults applied; a route whose rules do not
// build is left out (Validate reports it).
func (c Config) retryPolicies(t string) []*recovery.Policy {
	var out []*recovery.Policy
	if p, err := c.recovery(); err == nil {
		out = append(out, p)
	}
	for _, r := range c.Routes {
		if r.Retry == nil && !r.OwnTopics || len(r.Topics) > 0 && !slices.Contains(r.Topics, t) {
			continue
		}
		if p, err := c.withRetry(c.routeRetry(r)).recovery(); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// sameTopics reports whether a and b forward to the same topics of t with
// the same delays (recovery's signature of a policy).
func sameTopics(a, b retrytopic.Policy, t, group string) bool {
	return slices.Equal(a.Topics(t, group), b.Topics(t, group)) && slices.Equal(a.Delays, b.Delays)
}

// tierTopics returns every retry tier topic of source topic t, of every
// route's ladders, once each.
func (c Config) tierTopics(t string) []string {
	return c.topicsOf(t, nil, (*recovery.Policy).TierTopics)
}

// topicsOf appends to out the topics names gives for source topic t on the
// retry policy of each route of t, once each.
func (c Config) topicsOf(t string, out []string, names func(p *recovery.Policy, topic, group string) []string) []string {
	for _, p := range c.retryPolicies(t) {
		for _, name := range names(p, t, c.Group) {
			if !slices.Contains(out, name) {
				out = append(out, name)
			}
		}
	}
	return out
}

// validateRoutes checks Config.Routes, TypeOf, Unmatched and Filter (c has
// its defaults applied): every problem names the route and its field.
func (c Config) validateRoutes(errs *configerr.List) {
	if c.Unmatched != UnmatchedDeadLetter && c.Unmatched != UnmatchedSkip {
		errs.Bad("Unmatched", c.Unmatched, "unknown policy")
	}
	if c.TypeHeader != "" && c.TypeOf != nil {
		errs.Bad("TypeHeader", c.TypeHeader, "set TypeHeader or TypeOf, not both: they name the same thing")
	}
	names := map[string]int{}
	for i, r := range c.Routes {
		where := fmt.Sprintf("Routes[%d]", i)
		if r.Name != "" {
			where = fmt.Sprintf("Routes[%q]", r.Name)
		}
		switch prev, dup := names[r.Name]; {
		case r.Name == "":
			errs.Bad(where+".Name", r.Name, "a route needs a name (the route label of the metrics)")
		case dup:
			errs.Bad(where+".Name", r.Name, fmt.Sprintf("Routes[%d] has it too: names are unique", prev))
		case r.Name == defaultRoute:
			errs.Bad(where+".Name", r.Name, `"default" names the handler given to Run`)
		case len(r.Name) > 64 || strings.Trim(r.Name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "":
			errs.Bad(where+".Name", r.Name, "must be 1 to 64 characters of [a-zA-Z0-9._-]")
		}
		names[r.Name] = i
		if f, ok := r.Handler.(handler.Func); r.Handler == nil || ok && f == nil {
			errs.Bad(where+".Handler", nil, "a route needs a handler (handler.Batch(nil) and a nil handler.Func are nil)")
		}
		for j, t := range r.Topics {
			switch {
			case !slices.Contains(c.Topics, t):
				errs.Bad(where+".Topics", t, "not in Config.Topics: a route takes messages of the topics Run consumes")
			case slices.Contains(r.Topics[:j], t):
				errs.Bad(where+".Topics", t, "listed twice")
			}
		}
		for j, typ := range r.Types {
			switch {
			case typ == "":
				errs.Bad(where+".Types", r.Types, "types must not be empty")
			case slices.Contains(r.Types[:j], typ):
				errs.Bad(where+".Types", typ, "listed twice")
			}
		}
		if len(r.Types) > 0 && c.TypeOf == nil && c.TypeHeader == "" {
			errs.Bad(where+".Types", r.Types, `routing by type needs Config.TypeHeader (e.g. "ce_type") or Config.TypeOf (e.g. a serde.Registry's RecordName)`)
		}
		if by := c.shadowedBy(i); by >= 0 {
			errs.Bad(where, r.Name, fmt.Sprintf("is never reached: Routes[%d] (%q) comes first and takes every message it would", by, c.Routes[by].Name))
		}
		c.validateRoutePolicies(errs, where, r)
	}
	c.validateRouteTopics(errs)
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

// validateRoutePolicies checks the route's own Retry, Expiry and Batch as
// Validate checks the Config's, and reports their problems under where.
func (c Config) validateRoutePolicies(errs *configerr.List, where string, r Route) {
	if r.Retry == nil && r.Expiry == nil && r.Batch == nil && !r.OwnTopics {
		return
	}
	mc := c
	mc.Routes, mc.TypeOf = nil, nil
	if len(r.Topics) > 0 {
		mc.Topics = r.Topics
	}
	mc.Retry = c.routeRetry(r)
	mc.Expiry = routeExpiry(c, r)
	mc.Batch = routeBatch(c, r)
	own := map[string]bool{"Retry": r.Retry != nil || r.OwnTopics, "Expiry": r.Expiry != nil, "Batch": r.Batch != nil}
	for _, e := range configErrorsOf(mc.Validate()) {
		field := strings.TrimPrefix(e.Field, "Config.")
		group, _, _ := strings.Cut(field, ".")
		if !own[group] {
			continue // the Config's own: reported for Config
		}
		e.Field = "Config." + where + "." + field
		errs.Add(e)
	}
	if _, swept := c.Dedupe.(sweepable); swept && !c.Retention.NoSweep && r.Retry != nil {
		if keep, tiers := inboxRetention(c), mc.Retry.Tiers.WithDefaults().Retention; keep < tiers {
			errs.Bad(where+".Retry.Tiers.Retention", tiers, fmt.Sprintf("must be at most Retention.Keep (%s): a record may wait that long in the route's retry tiers or dead-letter topic, and a copy of a message handled meanwhile must still find its key", keep))
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

// validateRouteTopics checks the tier and dead-letter topics of each source
// topic across its routes: one tier topic has one ladder of delays (a tier
// partition is read in due-time order), and no tier topic is a dead-letter
// topic.
func (c Config) validateRouteTopics(errs *configerr.List) {
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
					errs.Bad("Routes", name, fmt.Sprintf("the retry tier topic of %s (%s) and of %s (%s): one tier topic has one delay; give a route topics of its own (Route.OwnTopics, or Retry.Tiers.TierTopic)", prev.who, prev.delays, who, u.delays))
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
				errs.Bad("Routes", name, fmt.Sprintf("the dead-letter topic of %s is a retry tier topic of %s", who, u.who))
			}
		}
	}
}

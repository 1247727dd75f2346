package consumer

import (
	"fmt"
	"slices"
	"time"

	"github.com/idemhq/idem/breaker"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/recovery"
)

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

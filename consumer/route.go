package consumer

import (
	"fmt"
	"slices"

	"github.com/idemhq/idem/handler"
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

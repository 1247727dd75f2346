// Package recovery is the per-error recoverability policy: rules, matched in
// order, that choose for each failure how many handler attempts a message
// gets, how long the waits between them are, which ladder of retry tiers it
// climbs and which dead-letter topic it ends in. (NServiceBus calls this a
// recoverability policy; Spring Kafka, exception-based DLT destinations.)
//
// # Rules
//
//	fallback := recovery.Fallback{ // the consumer's Config: today's behaviour
//		Attempts: 1 + 3,
//		Backoff:  recovery.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second},
//	}
//	errFraud := errors.New("bank: fraud suspected")
//	policy, err := recovery.New(fallback,
//		recovery.Rule{Name: "fraud", Match: recovery.Is(errFraud),
//			Attempts: 1, Tiers: &recovery.Ladder{}, DLQ: "payments.dlq.fraud"},
//		recovery.Rule{Name: "timeout", Match: recovery.Kind(handler.KindTimeout),
//			Attempts: 5, Tiers: &recovery.Ladder{Name: "slow", Delays: []time.Duration{time.Minute, 10 * time.Minute}}},
//		recovery.Rule{Name: "validation", Match: recovery.HTTPStatus(400, 422),
//			Attempts: 1, Tiers: &recovery.Ladder{}},
//	)
//	if err != nil {
//		log.Fatal(err) // names the index of every bad rule
//	}
//	d := policy.Decide(fmt.Errorf("charge: %w", errFraud))
//	fmt.Println(d.Name, d.Retry.DLQ("payments", "billing")) // fraud payments.dlq.fraud
//
// A Rule's Match says which errors it takes:
//
//	Is(target)               errors.Is(err, target): a sentinel
//	As[T]()                  errors.As finds an error of type T (a pointer or an interface type)
//	Kind(kinds...)           handler.ErrorKind(err): retriable, permanent, panic, decode, timeout, …
//	SQLState(codes...)       a *pgconn.PgError whose SQLSTATE starts with a class ("23") or is a code ("40001")
//	HTTPStatus(codes...)     the first HTTPStatus() int in the chain: handler.HTTPStatus(err, 422), or a client's error type
//	HTTPStatusRange(lo, hi)  the same, for a range such as 400…499
//	Func(name, fn)           any test of your own
//	AnyOf(matchers...)       any of them
//
// Every matcher looks through the whole chain of wrapped errors. Rules are
// tried in order and the first that matches decides (Policy.Decide); when
// none does, the Fallback decides. A rule's zero Attempts, Backoff fields,
// Tiers and DLQ are the Fallback's, so a rule names only what differs.
//
// # The fallback is today's behaviour
//
// Fallback holds what the consumer's Config.Retry says without rules:
// Attempts = Config.Retry.Attempts handler calls per delivery, Backoff =
// Config.Retry.Backoff (full jitter), Retry = Config.Retry.Tiers (its tiers
// and dead-letter topic). With no rules, every Decision is that, and
// Decision.Retry.Next routes exactly as Config.Retry.Tiers.Next does today.
//
// # What a decision does not change
//
// A rule chooses a budget and destinations, not whether a failure is the
// message's fault. An outage (the database, an open breaker, a dependency's
// Retry-After) is waited out before any rule is asked, spending nothing. A
// permanent failure (handler.Permanent, Decode, a missing key, a panic unless
// Config.Retry.Panics) is never retried: it goes to its decision's dead-letter topic
// at once, so a rule can route a permanent fraud decline to
// "payments.dlq.fraud". A retriable failure gets the decision's Attempts; to
// dead-letter one at once, give it Attempts 1 and no tiers (&Ladder{}).
//
// # Ladders
//
// Rules may send messages up ladders of their own (Ladder): tiers named
// "<topic>.<group>.retry.<ladder>.<n>", so that every tier topic holds
// records of one delay and is read in due-time order. A message's tier number
// only grows: one that fails at tier n goes to tier n+1 of the ladder of the
// rule its latest error matched (Decision.Retry.Next), or to that rule's
// dead-letter topic when the ladder has no tier n+1. So a message whose error
// changes between tiers still ends, after at most as many tiers as the
// longest ladder. Policy.TierTopics, DLQTopics, Retries and Tier give the
// consumer the topics to create and read and the place of a tier topic.
//
// # Validation
//
// New reports every problem at once, each naming the rule's index and name
// and starting "recovery: invalid policy": a rule with no matcher, a matcher built from
// bad arguments (an unknown kind, a malformed SQLSTATE, a status outside
// 100…599), negative Attempts, a bad Backoff, a ladder without a name or with
// a delay <= 0 or past half the tiers' retention, one ladder name with two
// sets of delays, an illegal dead-letter topic name. A DLQ of "" means the
// fallback's dead-letter topic; a blank one is an illegal name.
// Policy.ValidateNames checks the names a real topic and group give.
//
// The package holds no mutable package-level state; a Policy is immutable
// and safe for concurrent use.
package recovery

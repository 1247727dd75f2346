// Package mutate is the set of switches of the swarm checker's own proof (issue
// 28, item 5): for each invariant of internal/testing/chaos/check, a switch that
// turns off, in one line of production code, the mechanism the invariant
// guards, so that the swarm can be shown to find the breach within a few
// seeds (make swarm-proof; the table is in docs/guarantees.md).
//
// Without the build tag idem_mutate, On is a constant false: the compiler
// drops every switched line, and no production build can reach a mutation.
// With the tag (make swarm SWARMARGS='-tags idem_mutate -member-env
// IDEM_MUTATE=<name>'), On reports whether the comma-separated names in the
// environment variable IDEM_MUTATE hold name.
package mutate

// Env is the environment variable a build with the tag idem_mutate reads
// the switched-off mechanisms from (comma-separated names).
const Env = "IDEM_MUTATE"

// The mechanisms a switch turns off, each with the invariant that must
// catch it (docs/guarantees.md, "The checker's own proof").
const (
	Inbox        = "inbox"         // dedupe.Postgres: a key already recorded is processed again (every unique key applied exactly once)
	MarkEarly    = "mark-early"    // consumer: a message's offset is marked when it is read, before its outcome (every record ends in one final outcome)
	TxnMark      = "txn-mark"      // consumer, Transactions: a forward commits without its message's offset (each forward once per hop)
	Park         = "park"          // consumer, Ordering ByKey: nothing is parked behind a key's head (each key's effects in produced order)
	HookInbox    = "hook-inbox"    // consumer: a hook's run is not recorded in the inbox (hooks once per dead-lettered or expired message)
	OwedHooks    = "owed-hooks"    // consumer, Transactions: OnDeadLettered runs before its forward commits (hooks once per dead-lettered or expired message)
	OriginTS     = "origin-ts"     // consumer: a forward stamps its own time as the origin's (every copy keeps its origin)
	Expiry       = "expiry"        // consumer: no message is found expired (no record handled past its deadline or age)
	Decide       = "decide"        // consumer: an expired message is not looked up in the inbox first (every record ends in one final outcome)
	Adaptive     = "adaptive"      // consumer: Limits.Adaptive's slots are not waited for (handler calls in flight within the adaptive limit)
	TxnID        = "txn-id"        // consumer: transactional ids joined with '-' again (each transactional.id used by one group)
	Refusals     = "refusals"      // consumer, Transactions: a refused record's next try starts at its first form again (no lag left)
	Recover      = "recover"       // consumer: a handler's panic is not recovered (no process ended with an unexpected error)
	OutboxSettle = "outbox-settle" // outbox, ExactlyOnce: a committed round's rows stay pending (every outbox event published, applied once)
)

// Names lists every switch, in the proof's order.
var Names = []string{Inbox, MarkEarly, TxnMark, Park, HookInbox, OwedHooks, OriginTS, Expiry, Decide, Adaptive, TxnID, Refusals, Recover, OutboxSettle}

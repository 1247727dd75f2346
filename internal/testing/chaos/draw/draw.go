// Package draw is the swarm's generator (issue 28, "Prove every crossing"):
// from one seed it draws a configuration of the consumer out of the feature
// lattice, the shape of a workload and a schedule of faults, as swarm
// testing does (Groce et al., "Swarm Testing", ISSTA 2012): every draw
// leaves some features and faults out, so that the crossings of the others
// are drawn often.
//
// A Draw is a pure function of its Spec (the seed, the run's shape, and the
// features and faults forced on or dropped): Generate never reads the clock
// or the environment, and the same Spec gives the same Draw, byte for byte
// in its JSON. The harness (internal/testing/chaos, RunSwarm) turns a Draw into
// topics, members, records and faults; internal/testing/tools/swarm prints the Spec
// of a failing draw as a command that reruns it, and shrinks it by dropping
// features and faults one at a time (Shrink).
package draw

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Feature is one switch of the lattice.
type Feature string

// The features, in the order of the table. Each is on or off in a draw;
// what "on" means is said on each.
const (
	Batch          Feature = "batch"               // Config.Batch.MaxMessages = Config.BatchSize (2…64)
	BatchHandler   Feature = "batch-handler"       // a handler.Batch handler (its default batch of 500 without Batch)
	Lanes          Feature = "lanes"               // Config.Concurrency 4 or 16 (else 1)
	Adaptive       Feature = "adaptive"            // Config.Limits.Adaptive{Max: 4…12}
	Ordering       Feature = "ordering"            // Config.Ordering = ByKey(pool)
	Transactions   Feature = "transactions"        // Config.Transactions (timeout 3s or 10s)
	InstanceID     Feature = "instance-id"         // static membership: Config.InstanceID = "i-<n>" per slot
	Tiers          Feature = "tiers"               // Retry.Tiers with 1…3 delays (else none)
	RuleLadder     Feature = "rule-ladder"         // a rule with a ladder of its own
	RuleDLQ        Feature = "rule-dlq"            // a rule with a dead-letter topic of its own
	ExpiryAge      Feature = "expiry-age"          // Expiry.MaxAge 30…75s
	ExpiryDeadline Feature = "expiry-deadline"     // records with idem-deadline headers (past, short, far)
	Defer          Feature = "defer"               // Config.Defer and records that defer
	HookDLQ        Feature = "hook-dead-lettered"  // Config.OnDeadLettered
	HookExpired    Feature = "hook-expired"        // Config.Expiry.OnExpired
	HookFail       Feature = "hook-fail"           // the hooks fail in 1–2 windows
	Breaker        Feature = "breaker"             // dependency A behind a breaker.Set with limits, down in 1–2 windows
	Throttle       Feature = "throttle"            // dependency B answers 429 with Retry-After in 1–2 windows
	Outbox         Feature = "outbox"              // an outbox event per effect, a relay in each member
	OutboxEO       Feature = "outbox-exactly-once" // the relay with ExactlyOnce
	Members        Feature = "members"             // 2…4 members (else 1)
	Skew           Feature = "skew"                // Kafka keys drawn from a Zipf law (else uniform)
	Slow           Feature = "slow"                // slow handler calls (some past Transactions.Timeout)
)

// Features lists every feature in table order.
var Features = []Feature{Batch, BatchHandler, Lanes, Adaptive, Ordering, Transactions, InstanceID,
	Tiers, RuleLadder, RuleDLQ, ExpiryAge, ExpiryDeadline, Defer, HookDLQ, HookExpired, HookFail,
	Breaker, Throttle, Outbox, OutboxEO, Members, Skew, Slow}

// The fault kinds. Each names what the harness does at the fault's time.
const (
	FaultKill          = "kill"                 // SIGKILL a member, restart it
	FaultTerm          = "term"                 // SIGTERM a member (graceful: revoke, commit, close), restart it
	FaultJoin          = "join"                 // a new member joins while the group drains
	FaultFreeze        = "member-freeze"        // SIGSTOP a member past the session timeout, then SIGCONT
	FaultPGRestart     = "pg-restart"           // PostgreSQL stopped -m immediate and started
	FaultBrokerRestart = "broker-restart"       // a broker SIGKILLed and started
	FaultTxnAbort      = "txn-abort"            // a producer of a member's transactional.id aborts its open transaction
	FaultFence         = "fence"                // a second process with a member's InstanceID
	FaultRefuse        = "refuse"               // the DLQ's max.message.bytes lowered: the broker refuses forwards
	FaultTxnCollide    = "txn-id-collision"     // another group whose transactional.id equals a member's
	FaultLeaderKill    = "leader-kill"          // (3 nodes) SIGKILL a source partition's leader
	FaultCoordKill     = "coordinator-kill"     // (3 nodes) SIGKILL the group coordinator
	FaultTxnCoordKill  = "txn-coordinator-kill" // (3 nodes) SIGKILL a member's transaction coordinator
)

// FaultKinds lists the kinds for a cluster of nodes (1 or 3) in table order.
func FaultKinds(nodes int) []string {
	ks := []string{FaultKill, FaultTerm, FaultJoin, FaultFreeze, FaultPGRestart, FaultBrokerRestart,
		FaultTxnAbort, FaultFence, FaultRefuse, FaultTxnCollide}
	if nodes == 3 {
		ks = append(ks, FaultLeaderKill, FaultCoordKill, FaultTxnCoordKill)
	}
	return ks
}

// needs are the features a fault kind cannot happen without.
var needs = map[string][]Feature{
	FaultTxnAbort:     {Transactions},
	FaultFence:        {InstanceID},
	FaultTxnCollide:   {Transactions, InstanceID},
	FaultTxnCoordKill: {Transactions},
}

// Needs lists the features fault kind k needs.
func Needs(k string) []Feature { return needs[k] }

// Poison kinds: records no retry can mend, each with the idem-error-kind its
// DLQ record must carry.
var PoisonKinds = map[string]string{
	"empty-key":     "missing-key",    // an empty idempotency-key header
	"no-key":        "missing-key",    // no idempotency-key header at all
	"long-key":      "invalid-key",    // a 300-byte key (MaxKeyLength 256)
	"bad-utf8-key":  "invalid-key",    // a key that is not UTF-8
	"truncated":     "decode",         // malformed JSON
	"tombstone":     "decode",         // a null value
	"bad-utf8-body": "permanent",      // a value that is not UTF-8
	"reject":        "permanent",      // valid JSON the handler refuses
	"huge-headers":  "decode",         // 200 KiB of headers and malformed JSON
	"bad-deadline":  "invalid-header", // an idem-deadline that is not a time
	"oversized":     "decode",         // 300 KB of malformed JSON: more than the DLQ accepts
	"panic":         "panic",          // valid JSON on which the handler panics (a bug): recovered, dead-lettered
}

// PoisonOrder is PoisonKinds' keys in a fixed order.
var PoisonOrder = []string{"empty-key", "no-key", "long-key", "bad-utf8-key", "truncated", "tombstone",
	"bad-utf8-body", "reject", "huge-headers", "bad-deadline", "oversized", "panic"}

// Workload is the shape of what the producer sends; the records themselves
// are planned from it (internal/testing/chaos, planSwarm) with the draw's seed.
type Workload struct {
	Records    int      `json:"records"`     // records planned before duplicates
	Keys       int      `json:"keys"`        // Kafka keys they spread over
	Poison     []string `json:"poison"`      // the poison kinds sent
	PoisonEach int      `json:"poison_each"` // records of each
	DupRate    float64  `json:"dup_rate"`    // share of records sent a second time
	ProduceFor Duration `json:"produce_for"` // the producer spreads them over this long
}

// Fault is one fault of the schedule.
type Fault struct {
	ID   string  `json:"id"`   // kind, or kind#n for a kind's n-th (from 2)
	Kind string  `json:"kind"` //
	At   float64 `json:"at"`   // fraction of ProduceFor; join: seconds into the drain
	Slot int     `json:"slot"` // which member (modulo the live ones), or which partition
	// AtT0, when set, is when the fault happens since the members' T0, the
	// clock of the draw's windows (a hook's failing window): the fault is
	// placed in one. At is then only its place in the order.
	AtT0 Duration `json:"at_t0,omitzero"`
}

// Spec is what a draw is made from.
type Spec struct {
	Seed  uint64 `json:"seed"`
	Nodes int    `json:"nodes"` // 1 or 3 Kafka nodes
	CI    bool   `json:"ci"`    // the short form: fewer records, a shorter production
	// Force turns features and fault kinds on, Drop turns them (or one
	// fault, by its ID) off; Drop wins.
	Force []string `json:"force,omitempty"`
	Drop  []string `json:"drop,omitempty"`
}

// Draw is one seed's configuration, workload and fault schedule.
type Draw struct {
	Spec     Spec      `json:"spec"`
	Features []Feature `json:"features"` // the features on, in table order
	Config   Config    `json:"config"`
	Workload Workload  `json:"workload"`
	Faults   []Fault   `json:"faults"` // in time order (join last)
}

// Has reports whether f is on.
func (d *Draw) Has(f Feature) bool { return slices.Contains(d.Features, f) }

// FaultKindsDrawn lists the distinct fault kinds of the schedule.
func (d *Draw) FaultKindsDrawn() []string {
	var ks []string
	for _, f := range d.Faults {
		if !slices.Contains(ks, f.Kind) {
			ks = append(ks, f.Kind)
		}
	}
	return ks
}

// JSON is the draw, indented.
func (d *Draw) JSON() string {
	b, _ := json.MarshalIndent(d, "", "  ")
	return string(b)
}

// Summary is the draw in one line: seed, features, faults.
func (d *Draw) Summary() string {
	fs := make([]string, len(d.Features))
	for i, f := range d.Features {
		fs[i] = string(f)
	}
	ids := make([]string, len(d.Faults))
	for i, f := range d.Faults {
		ids[i] = f.ID
	}
	return fmt.Sprintf("seed %d: features [%s] faults [%s]", d.Spec.Seed, strings.Join(fs, " "), strings.Join(ids, " "))
}

// Args are the command-line flags that rerun spec with internal/testing/tools/swarm
// (the ports and -race are the caller's).
func (s Spec) Args() string {
	a := fmt.Sprintf("-seed %d", s.Seed)
	if s.CI {
		a += " -ci"
	}
	if s.Nodes == 3 {
		a += " -brokers 3"
	}
	if len(s.Force) > 0 {
		a += " -force " + strings.Join(s.Force, ",")
	}
	if len(s.Drop) > 0 {
		a += " -drop " + strings.Join(s.Drop, ",")
	}
	return a
}

// Package check is the chaos run's history checker, in the style of Jepsen's
// checkers: the harness (internal/testing/tools/chaos) gathers what the producer sent,
// what each member's handler did, the rows in PostgreSQL, the dead-letter
// topic and the group's lag into a History, and Check decides whether the run
// kept idem's guarantees. Every violation names the keys and offsets that
// broke it, with their timeline.
package check

import (
	"time"
)

// Expectation is what must become of a produced record.
type Expectation string

// The expectations of produced records.
const (
	// ExpectEffect: the record's idempotency key has exactly one effect.
	ExpectEffect Expectation = "effect"
	// ExpectDLQ: the record is in the dead-letter topic (with Produced.DLQKind)
	// and has no effect.
	ExpectDLQ Expectation = "dlq"
	// ExpectRival: the record and its Rival pay the same order with different
	// keys: exactly one of the two has an effect and the other is in the
	// dead-letter topic with kind "permanent". With ordering by key the
	// earlier-produced one wins.
	ExpectRival Expectation = "rival"
	// ExpectEither: the record either takes effect (its key, once) or is in
	// the dead-letter topic with one of its DLQ kinds (DLQKind, DLQKinds),
	// never both: a record that may expire, or whose dependency may
	// spend its retry budget (the swarm).
	ExpectEither Expectation = "either"
)

// Produced is one record the producer got acknowledged.
type Produced struct {
	Seq       int64       `json:"seq"`        // the chaos-seq header, unique per record sent
	Kind      string      `json:"kind"`       // payment, duplicate, rival, huge-headers, or a poison kind
	Expect    Expectation `json:"expect"`     //
	DLQKind   string      `json:"dlq_kind"`   // with ExpectDLQ: the idem-error-kind the DLQ record must carry
	Rival     int64       `json:"rival"`      // with ExpectRival: the other record's Seq
	Key       string      `json:"key"`        // idempotency key ("" for keyless poison)
	KafkaKey  string      `json:"kafka_key"`  //
	Order     string      `json:"order"`      // the order it pays ("" for poison)
	Topic     string      `json:"topic"`      //
	Partition int32       `json:"partition"`  //
	Offset    int64       `json:"offset"`     //
	At        time.Time   `json:"at"`         // acknowledged at
	FailFirst int         `json:"fail_first"` // injected failures of its first attempts

	// The swarm's records also say:
	Timestamp time.Time `json:"timestamp,omitzero"`  // the record's timestamp: its origin's, in every copy
	Deadline  time.Time `json:"deadline,omitzero"`   // its idem-deadline, when it has one that is a time
	DLQKinds  []string  `json:"dlq_kinds,omitempty"` // with ExpectDLQ or ExpectEither: other kinds its DLQ record may carry
	DLQTopic  string    `json:"dlq_topic,omitempty"` // the dead-letter topic it must reach ("": any of the group's)
	Unordered bool      `json:"unordered,omitzero"`  // it leaves its key's order (a deferred record): keyOrder skips it
}

// dlqKinds are the idem-error-kind values p's DLQ record may carry.
func (p *Produced) dlqKinds() []string {
	if p.DLQKind == "" {
		return p.DLQKinds
	}
	return append([]string{p.DLQKind}, p.DLQKinds...)
}

// Attempt is one handler call of a member, from its history file (the
// example's history.go writes these lines).
type Attempt struct {
	Member    string    `json:"member"`
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Key       string    `json:"key"`
	Seq       int64     `json:"seq"`
	Attempt   int       `json:"attempt"`
	Batch     int       `json:"batch"`
	Outcome   string    `json:"outcome"`
	Error     string    `json:"error,omitempty"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	// Origin is handler.Message.Origin as the handler saw it (the swarm's
	// members write it): the record where the message was first consumed.
	Origin *Origin `json:"origin,omitempty"`
	// InFlight is how many handler calls of the member ran, this one
	// included, when it began (the swarm's members count them).
	InFlight int `json:"in_flight,omitempty"`
}

// Origin is where a message was first consumed, as a handler saw it.
type Origin struct {
	Topic     string    `json:"topic"`
	Partition int32     `json:"partition"`
	Offset    int64     `json:"offset"`
	Timestamp time.Time `json:"timestamp"`
}

// Effect is one row of the chaos_effects ledger: one committed application
// of a message.
type Effect struct {
	ID        int64     // the ledger's bigserial: commit order within one key
	Key       string    // idempotency key
	KafkaKey  string    //
	Seq       int64     // chaos-seq of the copy that was applied
	Member    string    //
	Topic     string    // where that copy was read (a retry tier too)
	Partition int32     //
	Offset    int64     //
	Attempt   int       //
	At        time.Time //
}

// Payment is one row of the payments table.
type Payment struct {
	Key   string
	Order string
}

// DLQRecord is one record of a dead-letter topic (or a retry tier).
type DLQRecord struct {
	Topic     string // which one ("" in the payments runs: the group's DLQ)
	Partition int32
	Offset    int64
	Seq       int64             // chaos-seq header, -1 when absent
	Headers   map[string]string // the last value of each header
}

// Lag is one partition's state in the consumer group after the run.
type Lag struct {
	Topic     string
	Partition int32
	End       int64 // log-end offset
	Committed int64 // the group's committed offset (-1: none)
}

// Proc is one member process (one incarnation) and how it ended.
type Proc struct {
	Name     string
	Start    time.Time
	End      time.Time
	Killed   bool     // SIGKILLed by the harness: its exit status means nothing
	ExitCode int      // otherwise, its exit status
	Excused  string   // why a non-zero exit is expected (it could not reach a server that was down at its start)
	Problems []string // stderr lines that must not appear: panics, races, unexpected ERRORs
	// Group and TxnID are the consumer group and the transactional.id the
	// process logged at start (Config.Transactions; "" without).
	Group, TxnID string
}

// Fault is one injected fault, for timelines.
type Fault struct {
	Kind   string // kill, restart-member, pg-restart, broker-restart, broker-freeze, resize; on three nodes also leader-kill, tier-leader-kill, coordinator-kill, txn-coordinator-kill, rolling-restart; in the swarm also term, join, member-freeze, txn-abort, fence, refuse, txn-id-collision
	Detail string
	Start  time.Time
	End    time.Time
	// Member is the member process a member-freeze stopped (as the
	// members name themselves in their histories); "" for other faults.
	Member string
}

// Event is the outbox event of one payment: its copies on the events topic
// and its applications by the downstream consumer.
type Event struct {
	Key       string // the payment's idempotency key
	Stored    bool   // the payment is in the payments table
	Published int    // records on the events topic naming the payment
	IDs       int    // distinct idem-outbox-id among them (1: one event, maybe sent twice)
	Applied   int    // downstream ledger rows of the payment
}

// History is everything the checker looks at.
type History struct {
	Mode     string // the consumer mode; "ordering" checks per-key order
	Group    string // the consumer group
	Topic    string // the source topic
	Produced []Produced
	Attempts []Attempt
	Effects  []Effect
	Payments []Payment
	Orders   map[string]string // order id → status
	DLQ      []DLQRecord
	Lags     []Lag
	Procs    []Proc
	Faults   []Fault
	// Events are the outbox events, nil when the run had no outbox.
	Events []Event
	// Transactional: the members ran with Config.Transactions; DLQ, Tiers
	// and Events were read as a read_committed reader gets them.
	Transactional bool
	// Tiers are the records of each retry tier, by topic (transactional
	// runs, and every swarm run).
	Tiers map[string][]DLQRecord

	// The swarm's runs (internal/testing/chaos, RunSwarm) set Swarm: their records
	// are no payments (no orders, no rivals), DLQ holds the records of
	// every dead-letter topic of the group (DLQRecord.Topic), and these say
	// what else to check.
	Swarm       bool
	Ordering    bool          // Ordering ByKey: each key's effects in produced order
	HookDLQ     bool          // Config.OnDeadLettered was set
	HookExpired bool          // Config.Expiry.OnExpired was set
	Hooks       []Hook        // the rows the hooks wrote
	EventsOnce  bool          // the relay ran with ExactlyOnce: each event published once (Events read read_committed)
	AdaptiveMax int           // Limits.Adaptive.Max (0: not adaptive)
	MaxAge      time.Duration // Expiry.MaxAge (0: none)
	// ExpirySlack is how long after its deadline (or its max age) a
	// handler call may still begin: the consumer checks expiry right
	// before the handler, and a batch's later messages begin after its
	// earlier ones. The time a member-freeze stopped the calling member
	// (Fault.Member) is not counted: no check outruns SIGSTOP.
	ExpirySlack time.Duration
}

// Hook is one run of Config.OnDeadLettered or Config.Expiry.OnExpired, as
// the swarm's members record it in the hook's transaction.
type Hook struct {
	Hook   string // "dead-lettered" or "expired"
	Seq    int64  // chaos-seq of the message (-1 when absent)
	Key    string // its idempotency key ("" when it has none)
	Topic  string // the dead-letter topic (dead-lettered)
	Member string
	Origin Origin // where the message was first consumed
	Kind   string // the DLQ kind, or the expiry reason
	At     time.Time
}

// Package check is the chaos run's history checker, in the style of Jepsen's
// checkers: the harness (internal/tools/chaos) gathers what the producer sent,
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

// DLQRecord is one record of the dead-letter topic.
type DLQRecord struct {
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
}

// Fault is one injected fault, for timelines.
type Fault struct {
	Kind   string // kill, restart-member, pg-restart, broker-restart, broker-freeze, resize; on three nodes also leader-kill, tier-leader-kill, coordinator-kill, txn-coordinator-kill, rolling-restart
	Detail string
	Start  time.Time
	End    time.Time
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
	// runs only).
	Tiers map[string][]DLQRecord
}

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
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
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

// Duration is a time.Duration that reads and writes as text ("1.5s").
type Duration time.Duration

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON writes d as text.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads text written by MarshalJSON.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Window is a period of the run, from its start (the members' T0).
type Window struct {
	From Duration `json:"from"`
	To   Duration `json:"to"`
}

// In reports whether the instant at, since the start, falls in w.
func (w Window) In(at time.Duration) bool { return at >= w.From.D() && at < w.To.D() }

// Config is the members' configuration: what the member program
// (internal/testing/chaos/swarmmember) builds its consumer.Config from. Zero values
// mean the feature is off.
type Config struct {
	Partitions   int        `json:"partitions"`           // of the source topic
	Members      int        `json:"members"`              // slots started at first
	Attempts     int        `json:"attempts"`             // Retry.Attempts
	Tiers        []Duration `json:"tiers,omitempty"`      // Retry.Tiers.Delays
	BatchSize    int        `json:"batch_size,omitempty"` // Batch.MaxMessages
	BatchHandler bool       `json:"batch_handler,omitzero"`
	Concurrency  int        `json:"concurrency"`            // 1, 4 or 16
	AdaptiveMax  int        `json:"adaptive_max,omitempty"` // Limits.Adaptive.Max
	Ordering     bool       `json:"ordering,omitzero"`
	Transactions bool       `json:"transactions,omitzero"`
	TxnTimeout   Duration   `json:"txn_timeout,omitzero"` // Transactions.Timeout
	InstanceIDs  bool       `json:"instance_ids,omitzero"`
	// RuleLadder is the "ladder" rule: errors of the workload's kind
	// "ladder" climb a ladder of their own.
	RuleLadder *LadderRule `json:"rule_ladder,omitempty"`
	// RuleDLQ is the "fraud" rule: one attempt, no tiers, its own DLQ.
	RuleDLQ bool `json:"rule_dlq,omitzero"`
	// RuleDLQTiers: the "fraud" rule climbs the fallback's tiers before its
	// own DLQ (with Ordering, the only rule whose records can be promoted
	// heads bound for a dead-letter topic of their own).
	RuleDLQTiers bool `json:"rule_dlq_tiers,omitzero"`
	// Tier1MaxBytes, when set, is the first tier's max.message.bytes
	// (the harness creates it): the workload's "big" records fail into it
	// and it refuses them, so they go to their dead-letter topic whole.
	Tier1MaxBytes int      `json:"tier1_max_bytes,omitempty"`
	MaxAge        Duration `json:"max_age,omitzero"` // Expiry.MaxAge
	Defer         bool     `json:"defer,omitzero"`
	HookDLQ       bool     `json:"hook_dead_lettered,omitzero"`
	HookExpired   bool     `json:"hook_expired,omitzero"`
	HookFail      []Window `json:"hook_fail,omitempty"` // the hooks return an error in these windows
	// Breaker: dependency A has limits and is down in its windows (the
	// breaker opens); Throttle: dependency B answers 429 in its windows.
	Breaker      *BreakerSpec `json:"breaker,omitempty"`
	Throttle     []Window     `json:"throttle,omitempty"`
	RetryAfter   Duration     `json:"retry_after,omitzero"` // of B's 429s
	Outbox       bool         `json:"outbox,omitzero"`
	OutboxEO     bool         `json:"outbox_exactly_once,omitzero"`
	DLQMaxBytes  int          `json:"dlq_max_bytes,omitempty"` // the fallback DLQ is created with this max.message.bytes
	Backoff      Duration     `json:"backoff"`                 // Retry.Backoff.Max (Base is a tenth)
	BreakerOpen  Duration     `json:"breaker_open,omitzero"`   // Settings.OpenTimeout
	SessionTimer Duration     `json:"session_timeout"`         // Sarama Consumer.Group.Session.Timeout
}

// LadderRule is the "ladder" rule's budget and ladder.
type LadderRule struct {
	Attempts int        `json:"attempts"`
	Delays   []Duration `json:"delays"`
}

// BreakerSpec is dependency A: its flow limits and when it is down.
type BreakerSpec struct {
	Rate        float64  `json:"rate"`
	Burst       int      `json:"burst"`
	MaxInFlight int      `json:"max_in_flight"`
	Down        []Window `json:"down"`
}

// Budget is the handler calls a message failing with an error no rule
// matches gets before the DLQ: Attempts per delivery, at the source and in
// each tier.
func (c Config) Budget() int { return max(c.Attempts, 1) * (1 + len(c.Tiers)) }

// LadderBudget is the same for the "ladder" rule's errors.
func (c Config) LadderBudget() int {
	if c.RuleLadder == nil {
		return c.Budget()
	}
	return max(c.RuleLadder.Attempts, 1) * (1 + len(c.RuleLadder.Delays))
}

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

// probability of a feature, and of a fault kind, being on when neither
// forced nor dropped: swarm testing leaves about half the features out.
const (
	pFeature = 0.5
	pFault   = 0.3
)

// Generate draws spec's configuration, workload and faults. Unknown names in
// Force and Drop are an error.
func Generate(spec Spec) (*Draw, error) {
	if spec.Nodes == 0 {
		spec.Nodes = 1
	}
	if spec.Nodes != 1 && spec.Nodes != 3 {
		return nil, fmt.Errorf("draw: Nodes %d: want 1 or 3", spec.Nodes)
	}
	kinds := FaultKinds(spec.Nodes)
	for _, n := range append(slices.Clone(spec.Force), spec.Drop...) {
		base, _, _ := strings.Cut(n, "#")
		if !slices.Contains(Features, Feature(base)) && !slices.Contains(kinds, base) {
			return nil, fmt.Errorf("draw: %q is neither a feature nor a fault kind (features: %v; faults: %v)", n, Features, kinds)
		}
	}
	force := func(n string) bool { return slices.Contains(spec.Force, n) }
	drop := func(n string) bool { return slices.Contains(spec.Drop, n) }
	d := &Draw{Spec: spec}

	// Stream 1: the features and every feature's parameters, drawn whether
	// it is on or not, so that forcing or dropping one changes nothing else.
	r := rand.New(rand.NewPCG(spec.Seed, 1))
	on := map[Feature]bool{}
	for _, f := range Features {
		on[f] = r.Float64() < pFeature || force(string(f))
	}
	// Fault kinds force the features they need.
	for _, k := range kinds {
		if force(k) {
			for _, f := range needs[k] {
				on[f] = true
			}
		}
	}
	produceFor := 40 * time.Second
	if spec.CI {
		produceFor = 25 * time.Second
	}
	c := &d.Config
	c.Partitions = 3 + r.IntN(4)
	members := 2 + r.IntN(3)
	batch := 2 + r.IntN(63)
	conc := []int{4, 16}[r.IntN(2)]
	adaptive := 4 + r.IntN(9)
	txnTimeout := []time.Duration{3 * time.Second, 10 * time.Second}[r.IntN(2)]
	tiers := drawDelays(r, 1+r.IntN(3), []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second})
	c.Attempts = 2 + r.IntN(2)
	ladder := &LadderRule{Attempts: 2 + r.IntN(2), Delays: drawDelays(r, 1+r.IntN(2), []time.Duration{time.Second, 2 * time.Second, 4 * time.Second})}
	maxAge := time.Duration(30+r.IntN(46)) * time.Second
	hookFail := drawWindows(r, produceFor, 2*time.Second, 6*time.Second)
	brk := &BreakerSpec{Rate: float64(100 + r.IntN(301)), Burst: 10 + r.IntN(41), MaxInFlight: 4 + r.IntN(13),
		Down: drawWindows(r, produceFor, 2*time.Second, 4*time.Second)}
	throttle := drawWindows(r, produceFor, time.Second, 4*time.Second)
	retryAfter := time.Duration(1+r.IntN(2)) * time.Second
	coinOrdering := r.IntN(2) == 0
	fraudTiers := r.IntN(2) == 0
	tierRefuses := r.IntN(3) == 0
	// Stream 1 ends here: what follows only reads the switches.

	// Implications and the one conflict the library refuses (Validate: a
	// rule with a ladder of its own is not supported with Ordering ByKey).
	if on[OutboxEO] {
		on[Outbox] = true
	}
	if on[HookFail] && !on[HookDLQ] && !on[HookExpired] {
		on[HookDLQ] = true
	}
	if on[HookExpired] && !on[ExpiryAge] && !on[ExpiryDeadline] {
		on[ExpiryDeadline] = true
	}
	if on[Ordering] && on[RuleLadder] {
		switch {
		case force(string(Ordering)) && !force(string(RuleLadder)):
			on[RuleLadder] = false
		case force(string(RuleLadder)) && !force(string(Ordering)):
			on[Ordering] = false
		case coinOrdering:
			on[RuleLadder] = false
		default:
			on[Ordering] = false
		}
	}
	for _, f := range Features {
		if drop(string(f)) {
			on[f] = false
		}
	}
	// What depends on a dropped feature goes with it.
	if !on[Outbox] {
		on[OutboxEO] = false
	}
	if !on[HookDLQ] && !on[HookExpired] {
		on[HookFail] = false
	}
	for _, f := range Features {
		if on[f] {
			d.Features = append(d.Features, f)
		}
	}

	c.Members = when(on[Members], members, 1)
	c.BatchSize = when(on[Batch], batch, 0)
	c.BatchHandler = on[BatchHandler]
	c.Concurrency = when(on[Lanes], conc, 1)
	c.AdaptiveMax = when(on[Adaptive], adaptive, 0)
	c.Ordering = on[Ordering]
	c.Transactions = on[Transactions]
	c.TxnTimeout = when(on[Transactions], Duration(txnTimeout), 0)
	c.InstanceIDs = on[InstanceID]
	c.Tiers = when(on[Tiers], tiers, nil)
	c.RuleLadder = when(on[RuleLadder], ladder, nil)
	c.RuleDLQ = on[RuleDLQ]
	c.RuleDLQTiers = on[RuleDLQ] && on[Tiers] && fraudTiers
	c.Tier1MaxBytes = when(on[Tiers] && tierRefuses, 64<<10, 0)
	c.MaxAge = when(on[ExpiryAge], Duration(maxAge), 0)
	c.Defer = on[Defer]
	c.HookDLQ, c.HookExpired = on[HookDLQ], on[HookExpired]
	c.HookFail = when(on[HookFail], hookFail, nil)
	c.Breaker = when(on[Breaker], brk, nil)
	c.BreakerOpen = when(on[Breaker], Duration(5*time.Second), 0) // longer than a down window: one failure per call at most
	c.Throttle = when(on[Throttle], throttle, nil)
	c.RetryAfter = when(on[Throttle], Duration(retryAfter), 0)
	c.Outbox, c.OutboxEO = on[Outbox], on[OutboxEO]
	c.Backoff = Duration(500 * time.Millisecond)
	c.SessionTimer = Duration(10 * time.Second)

	// Stream 2: the workload's shape.
	w := rand.New(rand.NewPCG(spec.Seed, 2))
	d.Workload = Workload{ProduceFor: Duration(produceFor), DupRate: 0.05 + 0.15*w.Float64(), Keys: 10 + w.IntN(191)}
	d.Workload.Records = 1500 + w.IntN(1501)
	d.Workload.PoisonEach = 2 + w.IntN(3)
	if spec.CI {
		d.Workload.Records = 800 + w.IntN(701)
		d.Workload.PoisonEach = 1 + w.IntN(2)
	}
	for _, k := range PoisonOrder {
		if w.Float64() < 0.6 {
			d.Workload.Poison = append(d.Workload.Poison, k)
		}
	}
	if len(d.Workload.Poison) < 3 { // always a few kinds: a partition full of poison is part of every run
		d.Workload.Poison = append(d.Workload.Poison[:0], "empty-key", "truncated", "bad-deadline")
	}
	if slices.Contains(d.Workload.Poison, "oversized") {
		c.DLQMaxBytes = 128 << 10
	}

	// Stream 3: the faults, each kind drawn with its time and target whether
	// it happens or not.
	fr := rand.New(rand.NewPCG(spec.Seed, 3))
	for _, k := range kinds {
		n := 1
		if k == FaultKill {
			n = 1 + fr.IntN(3)
		}
		happens := fr.Float64() < pFault
		var fs []Fault
		for i := range n {
			id := k
			if i > 0 {
				id = fmt.Sprintf("%s#%d", k, i+1)
			}
			at := math.Round((0.08+0.8*fr.Float64())*1000) / 1000
			if k == FaultJoin {
				at = math.Round((1+3*fr.Float64())*10) / 10 // seconds into the drain
			}
			fs = append(fs, Fault{ID: id, Kind: k, At: at, Slot: fr.IntN(64)})
		}
		if !(happens || force(k)) || drop(k) {
			continue
		}
		if !slices.ContainsFunc(needs[k], func(f Feature) bool { return !on[f] }) {
			for _, f := range fs {
				if !drop(f.ID) {
					d.Faults = append(d.Faults, f)
				}
			}
		}
	}
	// Correlated placements: a crossing that needs a fault inside a window
	// of a feature is drawn there (issue 28, defect 1: a graceful stop
	// while OnDeadLettered fails, with Transactions), not left to chance.
	if on[Transactions] && len(c.HookFail) > 0 {
		if i := slices.IndexFunc(d.Faults, func(f Fault) bool { return f.Kind == FaultTerm }); i >= 0 {
			w := c.HookFail[0]
			at := w.From + (w.To-w.From)/2
			d.Faults[i].AtT0 = at
			d.Faults[i].At = math.Round(float64(at)/float64(produceFor)*1000) / 1000
		}
	}
	slices.SortStableFunc(d.Faults, func(a, b Fault) int {
		ta, tb := a.At, b.At
		if a.Kind == FaultJoin {
			ta += 10
		}
		if b.Kind == FaultJoin {
			tb += 10
		}
		switch {
		case ta < tb:
			return -1
		case ta > tb:
			return 1
		}
		return 0
	})
	return d, nil
}

// when is v when on, else off.
func when[T any](on bool, v, off T) T {
	if on {
		return v
	}
	return off
}

// drawDelays draws n delays out of choices, in increasing order.
func drawDelays(r *rand.Rand, n int, choices []time.Duration) []Duration {
	out := make([]Duration, n)
	for i := range out {
		out[i] = Duration(choices[r.IntN(len(choices))])
	}
	slices.Sort(out)
	return out
}

// drawWindows draws one or two windows within [0, within), each lo…hi long.
func drawWindows(r *rand.Rand, within, lo, hi time.Duration) []Window {
	n := 1 + r.IntN(2)
	out := make([]Window, n)
	for i := range out {
		from := time.Duration(r.Int64N(int64(within - hi))).Truncate(100 * time.Millisecond)
		out[i] = Window{From: Duration(from), To: Duration(from + lo + time.Duration(r.Int64N(int64(hi-lo))).Truncate(100*time.Millisecond))}
	}
	slices.SortFunc(out, func(a, b Window) int { return int(a.From - b.From) })
	return out
}

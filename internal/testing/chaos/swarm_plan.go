package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/testing/chaos/check"
	"github.com/idemhq/idem/internal/testing/chaos/draw"
)

// The swarm's workload: planSwarm lays out a draw's records, each with the
// chaos-* headers that tell the member's handler what to do with it
// (internal/testing/chaos/swarmmember) and what the checker must find of it. It is a
// pure function of the draw: the same draw plans the same records.

// poisonKey is the Kafka key of every poison record: they all go to one
// partition, each followed by a valid record that must still take effect
// (the black-box check that once stalled a partition did the same).
const poisonKey = "k-poison"

// kindWeight is one kind of valid record and how often it is drawn.
type kindWeight struct {
	kind string
	w    float64
}

// swarmKinds are the kinds of valid records d's features allow.
func swarmKinds(d *draw.Draw) []kindWeight {
	c := d.Config
	ks := []kindWeight{{"ok", 40}, {"exhaust", 1.5}, {"dup-key-header", 1}, {"binary-header", 1}, {"huge-header", 0.3}}
	if c.Budget() >= 2 {
		ks = append(ks, kindWeight{"flaky", 10})
	}
	add := func(f draw.Feature, kws ...kindWeight) {
		if d.Has(f) {
			ks = append(ks, kws...)
		}
	}
	add(draw.RuleLadder, kindWeight{"ladder", 5}, kindWeight{"ladder-exhaust", 1})
	add(draw.RuleDLQ, kindWeight{"fraud", 2})
	add(draw.Defer, kindWeight{"defer", 4})
	add(draw.Breaker, kindWeight{"dep-a", 8})
	add(draw.Throttle, kindWeight{"dep-b", 8})
	add(draw.Slow, kindWeight{"slow", 4})
	add(draw.ExpiryDeadline, kindWeight{"deadline-future", 2}, kindWeight{"deadline-past", 2}, kindWeight{"deadline-tier", 3}, kindWeight{"deadline-parked", 3})
	if c.Tier1MaxBytes > 0 { // records the first tier refuses: to their DLQ whole (as promoted heads too, with Ordering)
		ks = append(ks, kindWeight{"big", 2})
	}
	return ks
}

// planSwarm lays out d's records for member configuration m, keys prefixed
// with run.
func planSwarm(d *draw.Draw, m *draw.Member, run string) []record {
	r := rand.New(rand.NewPCG(d.Spec.Seed, 4))
	c := d.Config
	w := d.Workload
	var zipf *rand.Zipf
	if d.Has(draw.Skew) {
		zipf = rand.NewZipf(r, 1.3, 1, uint64(w.Keys-1))
	}
	kafkaKey := func() string {
		if zipf != nil {
			return "k" + strconv.FormatUint(zipf.Uint64(), 10)
		}
		return "k" + strconv.Itoa(r.IntN(w.Keys))
	}
	kinds := swarmKinds(d)
	var total float64
	for _, k := range kinds {
		total += k.w
	}
	pick := func() string {
		x := r.Float64() * total
		for _, k := range kinds {
			if x < k.w {
				return k.kind
			}
			x -= k.w
		}
		return "ok"
	}
	tier1 := time.Duration(0)
	if len(c.Tiers) > 0 {
		tier1 = c.Tiers[0].D()
	}

	var recs []record
	later := map[int][]record{}
	emit := func(rec record) {
		rec.Seq = int64(len(recs))
		rec.headers = append(slices.Clip(rec.headers), sarama.RecordHeader{Key: []byte("chaos-seq"), Value: []byte(strconv.FormatInt(rec.Seq, 10))})
		recs = append(recs, rec)
	}
	n := 0
	valid := func(kind, kk string) record {
		key := fmt.Sprintf("%s-%d", run, n)
		n++
		rec := record{Produced: check.Produced{Kind: kind, Expect: check.ExpectEffect, Key: key, KafkaKey: kk}}
		rec.headers = []sarama.RecordHeader{hdr("idempotency-key", key)}
		rec.value = fmt.Appendf(nil, `{"v":"ok","n":%d}`, n)
		return rec
	}
	// Poison goes at random places, each followed by a valid record of its
	// partition.
	poisonAt := map[int][]string{}
	for _, k := range w.Poison {
		for range w.PoisonEach {
			i := r.IntN(w.Records)
			poisonAt[i] = append(poisonAt[i], k)
		}
	}
	// Forwards in flight when a fault makes the transactional producer fatal
	// (issue 28, defect 3: a fenced producer closed while another forward was
	// sending on it): bursts of records that fail every attempt at their
	// source, around the fault's time. The producer sends records in chunks
	// of 100, paced over the production, so one burst is sent up to a chunk
	// early: one goes a chunk before the fault's place, one at it, one a
	// chunk after.
	burstAt := map[int]int{}
	if c.Transactions && len(c.Tiers) > 0 {
		for _, f := range d.Faults {
			if f.Kind == draw.FaultTxnAbort || f.Kind == draw.FaultFence {
				at := int(f.At * float64(w.Records))
				for _, i := range []int{at - 100, at, at + 100} {
					burstAt[min(max(i, 0), w.Records-1)] += 30
				}
			}
		}
	}
	for i := range w.Records {
		for range burstAt[i] {
			b := valid("burst", kafkaKey())
			b.header(hdrFail, c.Attempts)
			emit(expectAge(b, c))
		}
		rec := valid(pick(), kafkaKey())
		var head *record // a record that must go ahead of rec, on its key
		switch rec.Kind {
		case "flaky":
			rec.header(hdrFail, 1+r.IntN(c.Budget()-1))
		case "exhaust":
			rec.header(hdrFail, 1000)
			rec.Expect, rec.DLQKind = check.ExpectDLQ, "retriable"
		case "ladder":
			rec.header(hdrLadder, 1+r.IntN(max(c.LadderBudget()-1, 1)))
		case "ladder-exhaust":
			rec.header(hdrLadder, 1000)
			rec.Expect, rec.DLQKind = check.ExpectDLQ, "retriable"
		case "fraud":
			rec.header(hdrFraud, 1)
			rec.Expect, rec.DLQKind, rec.DLQTopic = check.ExpectDLQ, "retriable", m.FraudDLQ()
			if c.RuleDLQTiers && c.Tier1MaxBytes > 0 {
				// Through the fallback's tiers, the first refusing it, to the
				// rule's DLQ: every fraud record, so that a promoted head left
				// pending (issue 28, defect 11) is often one.
				rec.Kind, rec.value = "big-fraud", bigValue(n)
			}
		case "big": // fails at its source, and its tier refuses it: dead-lettered whole
			rec.header(hdrFail, 1000)
			rec.value = bigValue(n)
			rec.Expect, rec.DLQKind = check.ExpectDLQ, "retriable"
		case "defer":
			rec.header(hdrDefer, 300+r.IntN(2700))
			rec.Unordered = true
		case "dep-a":
			rec.header(hdrDep, "A")
			if c.Budget() < 4 { // a call in a down window fails before the breaker opens: up to two attempts
				rec.Expect, rec.DLQKinds = check.ExpectEither, []string{"retriable"}
			}
		case "dep-b":
			rec.header(hdrDep, "B")
		case "slow":
			ms := 200 + r.IntN(1300)
			if c.Transactions && r.IntN(20) == 0 {
				ms = int(c.TxnTimeout.D()/time.Millisecond) + 1000 // past Transactions.Timeout
			}
			rec.header(hdrSlow, ms)
		case "deadline-future":
			rec.deadline(10 * time.Minute)
		case "deadline-past":
			rec.deadline(-time.Second)
			rec.Expect, rec.DLQKind = check.ExpectDLQ, "expired"
		case "deadline-tier": // fails until its first tier, where its deadline passes
			if tier1 > 0 {
				rec.header(hdrFail, c.Attempts)
				rec.deadline(tier1 / 2)
			} else {
				rec.header(hdrFail, max(c.Attempts-1, 1))
				rec.deadline(200 * time.Millisecond)
			}
			rec.Expect, rec.DLQKinds = check.ExpectEither, []string{"expired", "retriable"}
		case "deadline-parked": // parked behind a head in its first tier, where its deadline passes
			if tier1 > 0 {
				h := valid("parked-head", rec.KafkaKey)
				h.header(hdrFail, c.Attempts)
				head = &h
				rec.deadline(tier1 / 2)
				if c.Ordering && c.Transactions && d.Has(draw.Slow) && r.IntN(4) == 0 {
					rec.Kind = "slow-parked" // parked, and handled slower than Transactions.Timeout
					rec.header(hdrSlow, int(c.TxnTimeout.D()/time.Millisecond)+1000)
					rec.deadline(time.Hour)
				}
			} else {
				rec.deadline(300 * time.Millisecond)
			}
			if rec.Kind == "deadline-parked" {
				rec.Expect, rec.DLQKinds = check.ExpectEither, []string{"expired"}
			}
		case "dup-key-header": // two idempotency-key headers: the last one is the key
			rec.headers = append([]sarama.RecordHeader{hdr("idempotency-key", "decoy-"+rec.Key)}, rec.headers...)
		case "binary-header":
			b := make([]byte, 256)
			for j := range b {
				b[j] = byte(j)
			}
			rec.headers = append(rec.headers, sarama.RecordHeader{Key: []byte("chaos-binary"), Value: b})
		case "huge-header":
			rec.headers = append(rec.headers, hdr("chaos-big", strings.Repeat("x", 300<<10)))
		}
		if head != nil {
			emit(expectAge(*head, c))
		}
		rec = expectAge(rec, c)
		emit(rec)
		if r.Float64() < w.DupRate {
			dup := rec
			dup.Kind = "dup-" + rec.Kind
			dup.headers = slices.Clone(rec.headers)
			at := i + 1 + r.IntN(200)
			later[at] = append(later[at], dup)
		}
		for _, k := range poisonAt[i] {
			emit(expectAge(swarmPoison(k, fmt.Sprintf("%s-p%d", run, len(recs)), r), c))
			emit(expectAge(valid("after-poison", poisonKey), c))
		}
		for _, dup := range later[i] {
			emit(dup)
		}
		delete(later, i)
	}
	for i := w.Records; len(later) > 0; i++ {
		for _, dup := range later[i] {
			emit(dup)
		}
		delete(later, i)
	}
	return recs
}

// expectAge widens rec's expectation for Expiry.MaxAge: any record may then
// expire, behind faults that delay it.
func expectAge(rec record, c draw.Config) record {
	if c.MaxAge == 0 {
		return rec
	}
	if rec.Expect == check.ExpectEffect {
		rec.Expect = check.ExpectEither
	}
	if !slices.Contains(rec.DLQKinds, "expired") && rec.DLQKind != "expired" {
		rec.DLQKinds = append(slices.Clone(rec.DLQKinds), "expired")
	}
	return rec
}

// swarmPoison is a record of poison kind k with key key (if it has one).
func swarmPoison(k, key string, r *rand.Rand) record {
	rec := record{Produced: check.Produced{Kind: k, Expect: check.ExpectDLQ, DLQKind: draw.PoisonKinds[k], Key: key, KafkaKey: poisonKey}}
	rec.value = fmt.Appendf(nil, `{"v":"ok","p":%q}`, key)
	rec.headers = []sarama.RecordHeader{hdr("idempotency-key", key)}
	switch k {
	case "empty-key":
		rec.Key, rec.headers = "", []sarama.RecordHeader{hdr("idempotency-key", "")}
	case "no-key":
		rec.Key, rec.headers = "", nil
	case "long-key":
		rec.Key, rec.headers = "", []sarama.RecordHeader{hdr("idempotency-key", strings.Repeat("k", 300))}
	case "bad-utf8-key":
		rec.Key, rec.headers = "", []sarama.RecordHeader{hdr("idempotency-key", "pay-\xff\xfe-"+key)}
	case "truncated":
		rec.value = rec.value[:len(rec.value)/2]
	case "tombstone":
		rec.value = nil
	case "bad-utf8-body":
		rec.value = []byte(`{"v":"ok` + "\xff\xfe" + `"}`)
	case "reject":
		rec.value = []byte(`{"v":"reject"}`)
	case "huge-headers":
		rec.headers = append(rec.headers, hugeHeaders()...)
		rec.value = rec.value[:len(rec.value)-3]
	case "bad-deadline":
		rec.headers = append(rec.headers, hdr("idem-deadline", []string{"tomorrow", "2026-13-45", "-", "0x10"}[r.IntN(4)]))
	case "oversized":
		rec.value = fmt.Appendf(nil, `{"v":"ok","pad":"%s`, strings.Repeat("z", 300<<10))
	case "panic":
		rec.value = []byte(`{"v":"panic"}`)
	}
	return rec
}

// bigValue is valid JSON of about 100 KB: more than the first tier takes
// when it refuses (draw.Config.Tier1MaxBytes), less than any DLQ's limit.
func bigValue(n int) []byte {
	return fmt.Appendf(nil, `{"v":"ok","n":%d,"pad":"%s"}`, n, strings.Repeat("b", 100<<10))
}

// The handler's headers (internal/testing/chaos/swarmmember).
const (
	hdrFail   = "chaos-fail"
	hdrLadder = "chaos-fail-ladder"
	hdrFraud  = "chaos-fraud"
	hdrDefer  = "chaos-defer"
	hdrDep    = "chaos-dep"
	hdrSlow   = "chaos-slow"
)

func hdr(k, v string) sarama.RecordHeader {
	return sarama.RecordHeader{Key: []byte(k), Value: []byte(v)}
}

// header adds header k with value v (a string or an int) to rec.
func (rec *record) header(k string, v any) {
	rec.headers = append(rec.headers, hdr(k, fmt.Sprint(v)))
	if k == hdrFail {
		rec.FailFirst, _ = v.(int)
	}
}

// deadline gives rec an idem-deadline of d after it is sent (the producer
// writes it then).
func (rec *record) deadline(d time.Duration) {
	rec.deadlineIn, rec.hasDeadline = d, true
}

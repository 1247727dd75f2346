package check

import (
	"cmp"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// This file is the invariants every run is checked against (Check picks
// those that apply to the run): exactly-once effects, rivals, orders,
// poison in the DLQ and nothing valid there, key order, the outbox, one
// copy per hop, lag and the processes' exits. The swarm's own are in
// swarm.go.

// exactlyOnce: every key that must take effect has exactly one effect row and
// (payments runs) one payment row; a key that may instead be dead-lettered
// (ExpectEither) has at most one effect row.
func (ix *index) exactlyOnce() Result {
	res := Result{Name: "every unique key applied exactly once"}
	keys, copies, effects := 0, 0, 0
	for _, p := range ix.h.Produced {
		if p.Expect == ExpectEffect || p.Expect == ExpectEither {
			copies++
		}
	}
	for _, key := range sortedKeys(ix.firstOfKey) {
		p := ix.firstOfKey[key]
		n := len(ix.effects[key])
		if p.Expect == ExpectEither {
			keys, effects = keys+1, effects+n
			if n > 1 {
				res.Violations = append(res.Violations, fmt.Sprintf("DOUBLE key %q: %d effects\n%s", key, n, ix.timeline(key, p.Seq)))
			}
			continue
		}
		if p.Expect != ExpectEffect {
			continue
		}
		keys++
		effects += n
		switch {
		case n == 0:
			res.Violations = append(res.Violations, fmt.Sprintf("LOST key %q: no effect\n%s", key, ix.timeline(key, p.Seq)))
		case n > 1:
			res.Violations = append(res.Violations, fmt.Sprintf("DOUBLE key %q: %d effects\n%s", key, n, ix.timeline(key, p.Seq)))
		case !ix.h.Swarm && len(ix.payments[key]) != 1:
			res.Violations = append(res.Violations, fmt.Sprintf("key %q: one effect but %d payment rows\n%s", key, len(ix.payments[key]), ix.timeline(key, p.Seq)))
		}
	}
	res.Counts = fmt.Sprintf("%d keys (%d records with duplicates), %d effects", keys, copies, effects)
	return res
}

// rivals: of two payments of one order, exactly one took effect and the
// other is dead-lettered as permanent; with ordering by key, the first one.
func (ix *index) rivals() Result {
	res := Result{Name: "of two payments for one order, one wins"}
	pairs, firstWon := 0, 0
	for _, p := range ix.h.Produced {
		if p.Expect != ExpectRival || p.Seq > p.Rival {
			continue
		}
		q, ok := ix.bySeq[p.Rival]
		if !ok {
			res.Violations = append(res.Violations, fmt.Sprintf("seq %d: its rival seq %d was not produced", p.Seq, p.Rival))
			continue
		}
		pairs++
		first := &p // the one earlier in its partition, else the one sent first
		if before(q, &p) {
			first = q
		}
		np, nq := len(ix.effects[p.Key]), len(ix.effects[q.Key])
		var winner, loser *Produced
		switch {
		case np == 1 && nq == 0:
			winner, loser = &p, q
		case np == 0 && nq == 1:
			winner, loser = q, &p
		default:
			res.Violations = append(res.Violations, fmt.Sprintf("order %q: %d effects of %q and %d of %q (want exactly one in all)\n%s\n%s",
				p.Order, np, p.Key, nq, q.Key, ix.timeline(p.Key, p.Seq), ix.timeline(q.Key, q.Seq)))
			continue
		}
		if winner == first {
			firstWon++
		} else if ix.h.Mode == "ordering" && winner.KafkaKey == loser.KafkaKey {
			res.Violations = append(res.Violations, fmt.Sprintf("order %q: the later payment %q (%s) won over %q (%s) with ordering by key\n%s\n%s",
				p.Order, winner.Key, coord(winner), loser.Key, coord(loser), ix.timeline(winner.Key, winner.Seq), ix.timeline(loser.Key, loser.Seq)))
		}
		if !ix.inDLQ(loser, []string{"permanent"}) {
			res.Violations = append(res.Violations, fmt.Sprintf("order %q: losing payment %q (seq %d, %s) is not in the DLQ as permanent\n%s",
				p.Order, loser.Key, loser.Seq, coord(loser), ix.timeline(loser.Key, loser.Seq)))
		}
	}
	res.Counts = fmt.Sprintf("%d pairs, the first-produced won %d", pairs, firstWon)
	return res
}

// ordersPaidOnce: no order has two payments, and an order is paid exactly
// when it has a payment.
func (ix *index) ordersPaidOnce() Result {
	res := Result{Name: "no order paid twice"}
	paid := 0
	for _, order := range sortedKeys(ix.h.Orders) {
		status := ix.h.Orders[order]
		ps := ix.byOrder[order]
		switch {
		case len(ps) > 1:
			keys := make([]string, len(ps))
			for i, p := range ps {
				keys[i] = p.Key
			}
			res.Violations = append(res.Violations, fmt.Sprintf("order %q paid %d times, by %q", order, len(ps), keys))
		case len(ps) == 1 && status != "paid":
			res.Violations = append(res.Violations, fmt.Sprintf("order %q has payment %q but is %s", order, ps[0].Key, status))
		case len(ps) == 0 && status == "paid":
			res.Violations = append(res.Violations, fmt.Sprintf("order %q is paid but has no payment", order))
		}
		if status == "paid" {
			paid++
		}
	}
	for order := range ix.byOrder {
		if _, ok := ix.h.Orders[order]; !ok {
			res.Violations = append(res.Violations, fmt.Sprintf("payment for unknown order %q", order))
		}
	}
	res.Counts = fmt.Sprintf("%d orders, %d paid, %d payments", len(ix.h.Orders), paid, len(ix.h.Payments))
	return res
}

// noStrayEffects: nothing took effect that should not have: no poison
// record, no key nobody produced.
func (ix *index) noStrayEffects() Result {
	res := Result{Name: "no effect from poison or unknown keys"}
	for _, key := range sortedKeys(ix.effects) {
		if _, ok := ix.firstOfKey[key]; ok {
			continue
		}
		for _, e := range ix.effects[key] {
			res.Violations = append(res.Violations, fmt.Sprintf("STRAY effect of key %q (seq %d, read at %s/%d/%d by %s)", key, e.Seq, e.Topic, e.Partition, e.Offset, e.Member))
		}
	}
	for _, key := range sortedKeys(ix.payments) {
		if _, ok := ix.firstOfKey[key]; !ok {
			res.Violations = append(res.Violations, fmt.Sprintf("STRAY payment row of key %q", key))
		}
	}
	res.Counts = fmt.Sprintf("%d effect rows, %d payment rows", len(ix.h.Effects), len(ix.h.Payments))
	return res
}

// poisonInDLQ: every poison record is in the dead-letter topic with its
// original coordinates, group and error kind.
func (ix *index) poisonInDLQ() Result {
	res := Result{Name: "every poison record in the DLQ with its metadata"}
	n, copies := 0, 0
	kinds := map[string]int{}
	for i := range ix.h.Produced {
		p := &ix.h.Produced[i]
		if p.Expect != ExpectDLQ {
			continue
		}
		n++
		kinds[p.Kind]++
		copies += len(ix.dlq[p.Seq])
		if !ix.inDLQ(p, p.dlqKinds()) && (!ix.h.Swarm || ix.twinInDLQ(p) == nil) {
			where := "the DLQ"
			if p.DLQTopic != "" {
				where = p.DLQTopic
			}
			res.Violations = append(res.Violations, fmt.Sprintf("POISON seq %d (%s, %s) not in %s with kind %s\n%s",
				p.Seq, p.Kind, coord(p), where, strings.Join(p.dlqKinds(), " or "), ix.timeline(p.Key, p.Seq)))
		}
	}
	var ks []string
	for _, k := range sortedKeys(kinds) {
		ks = append(ks, fmt.Sprintf("%s %d", k, kinds[k]))
	}
	res.Counts = fmt.Sprintf("%d poison records (%s), %d DLQ copies", n, strings.Join(ks, ", "), copies)
	return res
}

// twinInDLQ is a record with p's idempotency key, other than p, that is in
// the DLQ with one of its kinds (nil if none): p's copy may be skipped as
// the same message (with Ordering, a copy of a parked message is).
func (ix *index) twinInDLQ(p *Produced) *Produced {
	for _, q := range ix.byKey[p.Key] {
		if q.Seq != p.Seq && ix.inDLQ(q, q.dlqKinds()) {
			return q
		}
	}
	return nil
}

// inDLQ reports whether a DLQ record of p carries p's original coordinates,
// the group and one of kinds; with p's own kind, in p's DLQ topic when it
// names one (an expired record goes to the fallback DLQ, not its rule's).
// It explains nothing: the caller prints the timeline.
func (ix *index) inDLQ(p *Produced, kinds []string) bool {
	for _, d := range ix.dlq[p.Seq] {
		if d.Headers["idem-original-topic"] == p.Topic &&
			d.Headers["idem-original-partition"] == strconv.Itoa(int(p.Partition)) &&
			d.Headers["idem-original-offset"] == strconv.FormatInt(p.Offset, 10) &&
			d.Headers["idem-consumer-group"] == ix.h.Group &&
			slices.Contains(kinds, d.Headers["idem-error-kind"]) &&
			(p.DLQTopic == "" || d.Topic == p.DLQTopic || d.Headers["idem-error-kind"] != p.DLQKind) {
			return true
		}
	}
	return false
}

// nothingValidInDLQ: no record that had to take effect was dead-lettered,
// one that may be was with a kind it may have (and in its DLQ topic), and
// every DLQ record comes from a produced record.
func (ix *index) nothingValidInDLQ() Result {
	res := Result{Name: "no valid payment in the DLQ"}
	for _, d := range ix.h.DLQ {
		p, ok := ix.bySeq[d.Seq]
		kind := d.Headers["idem-error-kind"]
		switch {
		case !ok:
			res.Violations = append(res.Violations, fmt.Sprintf("DLQ record %s%d/%d has chaos-seq %d, which was not produced (kind %s, error %q)",
				topicPrefix(d.Topic), d.Partition, d.Offset, d.Seq, kind, d.Headers["idem-error"]))
		case p.Expect == ExpectEffect,
			p.Expect == ExpectEither && !slices.Contains(p.dlqKinds(), kind),
			p.Expect == ExpectEither && p.DLQTopic != "" && d.Topic != p.DLQTopic && kind == p.DLQKind:
			res.Violations = append(res.Violations, fmt.Sprintf("VALID seq %d key %q (%s, %s) dead-lettered at DLQ %s%d/%d: kind %s, error %q\n%s",
				p.Seq, p.Key, p.Kind, coord(p), topicPrefix(d.Topic), d.Partition, d.Offset, kind, d.Headers["idem-error"], ix.timeline(p.Key, p.Seq)))
		}
	}
	res.Counts = fmt.Sprintf("%d DLQ records", len(ix.h.DLQ))
	return res
}

// keyOrder: with ordering by key, each Kafka key's effects are in the order
// the records that took effect were produced (their offsets: one Kafka key,
// one partition).
func (ix *index) keyOrder() Result {
	res := Result{Name: "each key's effects in produced order"}
	byKafkaKey := map[string][]Effect{}
	for _, e := range ix.h.Effects {
		byKafkaKey[e.KafkaKey] = append(byKafkaKey[e.KafkaKey], e)
	}
	checked := 0
	for _, kk := range sortedKeys(byKafkaKey) {
		es := byKafkaKey[kk]
		slices.SortFunc(es, func(a, b Effect) int { return cmp.Compare(a.ID, b.ID) })
		checked += len(es)
		var prev *Produced
		for _, e := range es {
			p, ok := ix.bySeq[e.Seq] // the copy that took effect: a twin sent later is ordered where it was sent
			if !ok || p.Key != e.Key {
				p, ok = ix.firstOfKey[e.Key]
			}
			if !ok || p.Unordered {
				continue // a stray effect, reported by noStrayEffects; a deferred record
			}
			if prev != nil && before(p, prev) {
				res.Violations = append(res.Violations, fmt.Sprintf("REORDERED kafka key %q: %q (produced at %s) took effect after %q (produced at %s)\n%s\n%s",
					kk, p.Key, coord(p), prev.Key, coord(prev), ix.timeline(prev.Key, prev.Seq), ix.timeline(p.Key, p.Seq)))
			}
			prev = p
		}
	}
	res.Counts = fmt.Sprintf("%d kafka keys, %d effects", len(byKafkaKey), checked)
	return res
}

// outbox: every stored payment's event was published at least once (one
// event id, maybe sent twice) and applied exactly once downstream; no event
// names a payment that was not stored.
func (ix *index) outbox() Result {
	res := Result{Name: "every outbox event published, applied once"}
	stored, published, applied := 0, 0, 0
	for _, e := range ix.h.Events {
		published += e.Published
		applied += e.Applied
		if e.Stored {
			stored++
		}
		switch {
		case !e.Stored:
			res.Violations = append(res.Violations, fmt.Sprintf("payment %q is not stored but has %d events published, %d applied", e.Key, e.Published, e.Applied))
		case e.Published == 0:
			res.Violations = append(res.Violations, fmt.Sprintf("the event of payment %q was never published (applied %d times)", e.Key, e.Applied))
		case e.IDs != 1:
			res.Violations = append(res.Violations, fmt.Sprintf("payment %q has %d distinct events (ids), want 1", e.Key, e.IDs))
		case e.Applied != 1:
			res.Violations = append(res.Violations, fmt.Sprintf("the event of payment %q was applied %d times downstream (published %d times)", e.Key, e.Applied, e.Published))
		case ix.h.EventsOnce && e.Published != 1:
			res.Violations = append(res.Violations, fmt.Sprintf("the event of payment %q was published %d times with ExactlyOnce (read_committed)", e.Key, e.Published))
		}
	}
	res.Counts = fmt.Sprintf("%d payments' events, %d published copies (%d re-sent), %d applied", stored, published, published-stored, applied)
	return res
}

// noLag: the group committed every record of every topic it reads.
func (ix *index) noLag() Result {
	res := Result{Name: "no lag left"}
	var total int64
	for _, l := range ix.h.Lags {
		committed := max(l.Committed, 0)
		if l.End > committed {
			total += l.End - committed
			res.Violations = append(res.Violations, fmt.Sprintf("%s/%d: committed %d, end %d: lag %d", l.Topic, l.Partition, l.Committed, l.End, l.End-committed))
		}
	}
	res.Counts = fmt.Sprintf("%d partitions, lag %d", len(ix.h.Lags), total)
	return res
}

// processes: every member that was not SIGKILLed exited 0, and no member
// printed a panic, a data race or an unexpected ERROR.
func (ix *index) processes() Result {
	res := Result{Name: "no process ended with an unexpected error"}
	killed, excused := 0, 0
	why := map[string]int{} // excuses, their broker addresses left out
	for _, p := range ix.h.Procs {
		switch {
		case p.Killed:
			killed++
		case p.ExitCode != 0 && p.Excused != "":
			excused++
			why[addrs.ReplaceAllString(p.Excused, "…")]++
		case p.ExitCode != 0:
			res.Violations = append(res.Violations, fmt.Sprintf("%s (%s – %s) exited with status %d", p.Name, clock(p.Start), clock(p.End), p.ExitCode))
		}
		for _, line := range p.Problems {
			res.Violations = append(res.Violations, fmt.Sprintf("%s: %s", p.Name, line))
		}
	}
	res.Counts = fmt.Sprintf("%d processes, %d SIGKILLed, %d exited at start during an outage", len(ix.h.Procs), killed, excused)
	reasons := slices.Sorted(maps.Keys(why))
	for _, r := range reasons {
		res.Counts += fmt.Sprintf("\n       %d× %s", why[r], r)
	}
	return res
}

// addrs matches the addresses in an error text.
var addrs = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+(->\d+\.\d+\.\d+\.\d+:\d+)?`)

// oncePerHop (transactional runs): a read_committed reader sees each
// source record (source offset) at most once in each retry tier and in the
// DLQ; with poisonInDLQ, every poison record exactly once in the DLQ. A
// record the producer wrote twice (a retry whose first write's ack was
// lost in a broker restart or freeze: one seq at two source offsets) has
// one copy per source offset.
func (ix *index) oncePerHop() Result {
	res := Result{Name: "each forward once per hop (read_committed)"}
	hops, names := ix.hops()
	var counts []string
	type source struct {
		seq    int64
		origin string // idem-original-topic/partition/offset
	}
	for _, name := range names {
		copies := map[source]int{}
		seqs := map[int64]bool{}
		for _, d := range hops[name] {
			if d.Seq >= 0 {
				copies[source{d.Seq, d.Headers["idem-original-topic"] + "/" + d.Headers["idem-original-partition"] + "/" + d.Headers["idem-original-offset"]}]++
				seqs[d.Seq] = true
			}
		}
		for src, n := range copies {
			if n > 1 {
				key := ""
				if p := ix.bySeq[src.seq]; p != nil {
					key = p.Key
				}
				res.Violations = append(res.Violations, fmt.Sprintf("seq %d has %d copies in %s for a read_committed reader (source %s)\n%s",
					src.seq, n, name, src.origin, ix.timeline(key, src.seq)))
			}
		}
		counts = append(counts, fmt.Sprintf("%s: %d copies of %d records", name, len(hops[name]), len(seqs)))
	}
	slices.Sort(res.Violations)
	res.Counts = strings.Join(counts, "; ")
	return res
}

// hops are the records of every dead-letter topic and retry tier, by name
// ("dlq" for the payments runs' one DLQ), and the names in order.
func (ix *index) hops() (map[string][]DLQRecord, []string) {
	hops := map[string][]DLQRecord{}
	for _, d := range ix.h.DLQ {
		name := d.Topic
		if name == "" {
			name = "dlq"
		}
		hops[name] = append(hops[name], d)
	}
	if _, ok := hops["dlq"]; !ok && !ix.h.Swarm {
		hops["dlq"] = nil
	}
	for t, recs := range ix.h.Tiers {
		hops[t] = recs
	}
	return hops, slices.Sorted(maps.Keys(hops))
}

package check

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// This file is the swarm's invariants (issue 28): the ones that need what
// only the swarm's members record (origins, hooks, calls in flight) or
// what only the swarm draws (records that may expire, several dead-letter
// topics).

// outcomes: every record ends in exactly one final outcome. It is applied
// (its key has its effect, from this copy or a twin), dead-lettered, or
// expired (dead-lettered with kind "expired"); a deferred record is
// applied when its copy comes back; a copy of a message (its idempotency
// key) is a duplicate of its twin's outcome. A record applied by its own
// copy and also dead-lettered has two; a record that may expire and has
// none is lost. (Lost records that had to take effect are exactlyOnce's.)
func (ix *index) outcomes() Result {
	res := Result{Name: "every record ends in one final outcome"}
	applied, twins, deadTwins, dead, expired := 0, 0, 0, 0, 0
	for i := range ix.h.Produced {
		p := &ix.h.Produced[i]
		if p.Expect != ExpectEffect && p.Expect != ExpectEither {
			continue
		}
		copies := ix.dlq[p.Seq]
		own := ix.effectSeq[p.Seq]
		switch {
		case len(copies) > 0 && own > 0:
			res.Violations = append(res.Violations, fmt.Sprintf("TWO outcomes for seq %d key %q (%s, %s): applied and dead-lettered (kind %s)\n%s",
				p.Seq, p.Key, p.Kind, coord(p), copies[0].Headers["idem-error-kind"], ix.timeline(p.Key, p.Seq)))
		case len(copies) > 0:
			if copies[0].Headers["idem-error-kind"] == "expired" {
				expired++
			} else {
				dead++
			}
		case own > 0:
			applied++
		case len(ix.effects[p.Key]) > 0:
			twins++
		case ix.twinInDLQ(p) != nil:
			deadTwins++
		case p.Expect == ExpectEither:
			res.Violations = append(res.Violations, fmt.Sprintf("LOST seq %d key %q (%s, %s): neither applied nor dead-lettered\n%s",
				p.Seq, p.Key, p.Kind, coord(p), ix.timeline(p.Key, p.Seq)))
		}
	}
	res.Counts = fmt.Sprintf("%d applied, %d duplicates of an applied key, %d of a dead-lettered one, %d dead-lettered, %d expired", applied, twins, deadTwins, dead, expired)
	return res
}

// origins: every handler call saw the origin of its message as produced:
// the source topic, partition and offset, and the record's own timestamp,
// in a retry tier and in a deferred copy too (expiry by age and
// handler.Message.Origin measure from it).
func (ix *index) origins() Result {
	res := Result{Name: "every copy keeps its origin"}
	checked := 0
	bad := map[int64]bool{}
	for _, a := range ix.h.Attempts {
		p, ok := ix.bySeq[a.Seq]
		if a.Origin == nil || !ok || bad[a.Seq] {
			continue
		}
		checked++
		o := a.Origin
		switch {
		case o.Topic != p.Topic || o.Partition != p.Partition || o.Offset != p.Offset:
			res.Violations = append(res.Violations, fmt.Sprintf("ORIGIN of seq %d read at %s/%d/%d is %s/%d/%d, produced at %s\n%s",
				a.Seq, a.Topic, a.Partition, a.Offset, o.Topic, o.Partition, o.Offset, coord(p), ix.timeline(p.Key, p.Seq)))
		case !p.Timestamp.IsZero() && o.Timestamp.UnixMilli() != p.Timestamp.UnixMilli():
			res.Violations = append(res.Violations, fmt.Sprintf("ORIGIN timestamp of seq %d read at %s/%d/%d is %s, produced with %s (%s later)\n%s",
				a.Seq, a.Topic, a.Partition, a.Offset, clock(o.Timestamp), clock(p.Timestamp), o.Timestamp.Sub(p.Timestamp).Round(time.Millisecond), ix.timeline(p.Key, p.Seq)))
		default:
			continue
		}
		bad[a.Seq] = true
	}
	res.Counts = fmt.Sprintf("%d handler calls", checked)
	return res
}

// expiryHonoured: no handler call began past its record's deadline or
// maximum age (by the record's own timestamp), give or take ExpirySlack.
func (ix *index) expiryHonoured() Result {
	res := Result{Name: "no record handled past its deadline or age"}
	checked := 0
	bad := map[int64]bool{}
	for _, a := range ix.h.Attempts {
		p, ok := ix.bySeq[a.Seq]
		if !ok || bad[a.Seq] {
			continue
		}
		var limit time.Time
		var what string
		if !p.Deadline.IsZero() {
			limit, what = p.Deadline, "its deadline"
		}
		if ix.h.MaxAge > 0 && !p.Timestamp.IsZero() {
			if l := p.Timestamp.Add(ix.h.MaxAge); limit.IsZero() || l.Before(limit) {
				limit, what = l, fmt.Sprintf("its max age %s", ix.h.MaxAge)
			}
		}
		if limit.IsZero() {
			continue
		}
		checked++
		late := a.Start.Sub(limit)
		if frozen := ix.frozen(a.Member, p.Timestamp, a.Start); frozen > 0 && late > ix.h.ExpirySlack {
			// A member stopped between its expiry check and the call
			// checked in time: no check can outrun SIGSTOP (or a VM's
			// stall), so the pause does not count as lateness.
			late -= frozen
		}
		if late > ix.h.ExpirySlack {
			bad[a.Seq] = true
			res.Violations = append(res.Violations, fmt.Sprintf("EXPIRED seq %d (%s) handled at %s by %s (read at %s/%d/%d), %s after %s (%s)\n%s",
				a.Seq, p.Kind, clock(a.Start), a.Member, a.Topic, a.Partition, a.Offset, a.Start.Sub(limit).Round(time.Millisecond), what, clock(limit), ix.timeline(p.Key, p.Seq)))
		}
	}
	res.Counts = fmt.Sprintf("%d handler calls of records with a deadline or a max age (slack %s)", checked, ix.h.ExpirySlack)
	return res
}

// frozen is how long member was stopped by member-freeze faults between
// from and to.
func (ix *index) frozen(member string, from, to time.Time) time.Duration {
	var d time.Duration
	for _, f := range ix.h.Faults {
		if f.Member == "" || f.Member != member {
			continue
		}
		s, e := f.Start, f.End
		if e.IsZero() {
			e = to
		}
		s, e = later(s, from), earlier(e, to)
		if e.After(s) {
			d += e.Sub(s)
		}
	}
	return d
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func earlier(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// copies (without transactions): the extra copies in each dead-letter topic
// and tier, counted and reported; no copy count is promised.
func (ix *index) copies() Result {
	res := Result{Name: "copies per hop (without transactions: counted)"}
	hops, names := ix.hops()
	var counts []string
	for _, name := range names {
		distinct := map[int64]bool{}
		for _, d := range hops[name] {
			distinct[d.Seq] = true
		}
		counts = append(counts, fmt.Sprintf("%s: %d copies of %d records", name, len(hops[name]), len(distinct)))
	}
	res.Counts = strings.Join(counts, "; ")
	return res
}

// hooks: OnDeadLettered ran exactly once for each message in a dead-letter
// topic (as a read_committed reader sees it with transactions), OnExpired
// exactly once for each message dead-lettered as expired, and neither for
// any other message.
func (ix *index) hooks() Result {
	res := Result{Name: "hooks once per dead-lettered or expired message"}
	dead, expired := map[int64]bool{}, map[int64]bool{}
	for _, d := range ix.h.DLQ {
		if d.Seq < 0 {
			continue
		}
		dead[d.Seq] = true
		if d.Headers["idem-error-kind"] == "expired" {
			expired[d.Seq] = true
		}
	}
	runs := map[string]map[int64][]Hook{"dead-lettered": {}, "expired": {}}
	for _, hk := range ix.h.Hooks {
		seq := hk.Seq
		if seq < 0 {
			seq = ix.byCoord[fmt.Sprintf("%s/%d/%d", hk.Origin.Topic, hk.Origin.Partition, hk.Origin.Offset)]
		}
		if m, ok := runs[hk.Hook]; ok {
			m[seq] = append(m[seq], hk)
		}
	}
	check := func(hook string, on bool, want map[int64]bool) {
		if !on {
			return
		}
		got := runs[hook]
		for _, seq := range slices.Sorted(maps.Keys(want)) {
			if n := len(got[seq]); n != 1 {
				res.Violations = append(res.Violations, fmt.Sprintf("%s hook ran %d times for seq %d, %s\n%s", hook, n, seq, ix.what(seq), ix.timelineSeq(seq)))
			}
		}
		for _, seq := range slices.Sorted(maps.Keys(got)) {
			if !want[seq] {
				hk := got[seq][0]
				res.Violations = append(res.Violations, fmt.Sprintf("%s hook ran %d times for seq %d, %s, which is not dead-lettered%s (first by %s at %s, DLQ %s)\n%s",
					hook, len(got[seq]), seq, ix.what(seq), map[bool]string{true: " as expired", false: ""}[hook == "expired"], hk.Member, clock(hk.At), hk.Topic, ix.timelineSeq(seq)))
			}
		}
	}
	check("dead-lettered", ix.h.HookDLQ, dead)
	check("expired", ix.h.HookExpired, expired)
	res.Counts = fmt.Sprintf("%d dead-lettered (%d expired) messages; hook runs: %d dead-lettered, %d expired",
		len(dead), len(expired), count(runs["dead-lettered"]), count(runs["expired"]))
	return res
}

func count(m map[int64][]Hook) int {
	n := 0
	for _, hs := range m {
		n += len(hs)
	}
	return n
}

// what names the record seq: its kind and coordinates.
func (ix *index) what(seq int64) string {
	p, ok := ix.bySeq[seq]
	if !ok {
		return "never produced"
	}
	return fmt.Sprintf("%s %s key %q", p.Kind, coord(p), p.Key)
}

// timelineSeq is the timeline of record seq (of its key when it has one).
func (ix *index) timelineSeq(seq int64) string {
	key := ""
	if p, ok := ix.bySeq[seq]; ok {
		key = p.Key
	}
	return ix.timeline(key, seq)
}

// adaptiveLimit: with Limits.Adaptive, no member ran more handler calls at
// once than Adaptive.Max, batches included.
func (ix *index) adaptiveLimit() Result {
	res := Result{Name: "handler calls in flight within the adaptive limit"}
	peak := map[string]Attempt{}
	for _, a := range ix.h.Attempts {
		if a.InFlight > peak[a.Member].InFlight {
			peak[a.Member] = a
		}
	}
	most := 0
	for _, m := range slices.Sorted(maps.Keys(peak)) {
		a := peak[m]
		most = max(most, a.InFlight)
		if a.InFlight > ix.h.AdaptiveMax {
			res.Violations = append(res.Violations, fmt.Sprintf("%s ran %d handler calls at once at %s (Adaptive.Max %d; this one a batch of %d read at %s/%d/%d)",
				m, a.InFlight, clock(a.Start), ix.h.AdaptiveMax, a.Batch, a.Topic, a.Partition, a.Offset))
		}
	}
	res.Counts = fmt.Sprintf("%d members, at most %d calls at once (Adaptive.Max %d)", len(peak), most, ix.h.AdaptiveMax)
	return res
}

// txnIDsApart: no two consumer groups' members used one transactional.id
// (they would fence each other, aborting each other's transactions).
func (ix *index) txnIDsApart() Result {
	res := Result{Name: "each transactional.id used by one group"}
	groups := map[string]map[string][]string{} // id → group → processes
	for _, p := range ix.h.Procs {
		if p.TxnID == "" {
			continue
		}
		if groups[p.TxnID] == nil {
			groups[p.TxnID] = map[string][]string{}
		}
		groups[p.TxnID][p.Group] = append(groups[p.TxnID][p.Group], p.Name)
	}
	for _, id := range slices.Sorted(maps.Keys(groups)) {
		if len(groups[id]) < 2 {
			continue
		}
		var by []string
		for _, g := range slices.Sorted(maps.Keys(groups[id])) {
			by = append(by, fmt.Sprintf("group %q (%s)", g, strings.Join(groups[id][g], ", ")))
		}
		res.Violations = append(res.Violations, fmt.Sprintf("transactional.id %q used by %s", id, strings.Join(by, " and ")))
	}
	res.Counts = fmt.Sprintf("%d transactional ids", len(groups))
	return res
}

package check

import (
	"fmt"
	"io"
	"strings"
)

// Result is one invariant's verdict.
type Result struct {
	Name       string   // what must hold
	Counts     string   // what was checked, e.g. "50000 keys, 50000 effects"
	Violations []string // each with the keys, offsets and timeline that broke it
}

// OK reports whether the invariant held.
func (r Result) OK() bool { return len(r.Violations) == 0 }

// Report is the verdict of every invariant.
type Report struct {
	Results []Result
}

// OK reports whether every invariant held.
func (r *Report) OK() bool {
	for _, x := range r.Results {
		if !x.OK() {
			return false
		}
	}
	return true
}

// Failed names the invariants that did not hold.
func (r *Report) Failed() []string {
	var names []string
	for _, x := range r.Results {
		if !x.OK() {
			names = append(names, x.Name)
		}
	}
	return names
}

// maxShown bounds the violations printed per invariant.
const maxShown = 20

// Print writes one line per invariant and, under each failed one, its
// violations (at most maxShown).
func (r *Report) Print(w io.Writer) {
	for _, x := range r.Results {
		mark := "ok  "
		if !x.OK() {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "%s %-52s %s\n", mark, x.Name, x.Counts)
		for i, v := range x.Violations {
			if i == maxShown {
				fmt.Fprintf(w, "     … and %d more\n", len(x.Violations)-maxShown)
				break
			}
			fmt.Fprintf(w, "     - %s\n", strings.ReplaceAll(v, "\n", "\n       "))
		}
	}
}

// index is the history arranged for look-ups.
type index struct {
	h          *History
	bySeq      map[int64]*Produced
	firstOfKey map[string]*Produced // the first-produced record of each key
	effects    map[string][]Effect  // by key
	payments   map[string][]Payment // by key
	byOrder    map[string][]Payment // by order
	dlq        map[int64][]DLQRecord
	attempts   map[string][]Attempt // by key
	attemptSeq map[int64][]Attempt  // by seq (keyless records)
	byCoord    map[string]int64     // "topic/partition/offset" → seq
	effectSeq  map[int64]int        // effects applied by each seq's own copy
	byKey      map[string][]*Produced
}

func newIndex(h *History) *index {
	ix := &index{h: h, bySeq: map[int64]*Produced{}, firstOfKey: map[string]*Produced{},
		effects: map[string][]Effect{}, payments: map[string][]Payment{}, byOrder: map[string][]Payment{},
		dlq: map[int64][]DLQRecord{}, attempts: map[string][]Attempt{}, attemptSeq: map[int64][]Attempt{},
		byCoord: map[string]int64{}, effectSeq: map[int64]int{}, byKey: map[string][]*Produced{}}
	for i := range h.Produced {
		p := &h.Produced[i]
		ix.bySeq[p.Seq] = p
		ix.byCoord[coord(p)] = p.Seq
		if p.Key != "" {
			ix.byKey[p.Key] = append(ix.byKey[p.Key], p)
		}
		if p.Key == "" || p.Expect == ExpectDLQ {
			continue
		}
		if f, ok := ix.firstOfKey[p.Key]; !ok || before(p, f) {
			ix.firstOfKey[p.Key] = p
		}
	}
	for _, e := range h.Effects {
		ix.effects[e.Key] = append(ix.effects[e.Key], e)
		ix.effectSeq[e.Seq]++
	}
	for _, p := range h.Payments {
		ix.payments[p.Key] = append(ix.payments[p.Key], p)
		ix.byOrder[p.Order] = append(ix.byOrder[p.Order], p)
	}
	for i := range h.DLQ {
		d := &h.DLQ[i]
		d.Seq = ix.seqOf(*d)
		ix.dlq[d.Seq] = append(ix.dlq[d.Seq], *d)
	}
	for _, recs := range h.Tiers {
		for i := range recs {
			recs[i].Seq = ix.seqOf(recs[i])
		}
	}
	for _, a := range h.Attempts {
		ix.attempts[a.Key] = append(ix.attempts[a.Key], a)
		ix.attemptSeq[a.Seq] = append(ix.attemptSeq[a.Seq], a)
	}
	return ix
}

// seqOf is the produced record a DLQ or tier record is a copy of: its
// chaos-seq header, else (a stub without the original headers) its
// idem-original-* coordinates; -1 when neither names one.
func (ix *index) seqOf(d DLQRecord) int64 {
	if d.Seq >= 0 {
		return d.Seq
	}
	c := d.Headers["idem-original-topic"] + "/" + d.Headers["idem-original-partition"] + "/" + d.Headers["idem-original-offset"]
	if seq, ok := ix.byCoord[c]; ok {
		return seq
	}
	return -1
}

// Check runs every invariant over h.
func Check(h *History) *Report {
	ix := newIndex(h)
	r := &Report{}
	r.Results = append(r.Results, ix.exactlyOnce())
	if !h.Swarm {
		r.Results = append(r.Results, ix.rivals(), ix.ordersPaidOnce())
	}
	r.Results = append(r.Results, ix.noStrayEffects(), ix.poisonInDLQ(), ix.nothingValidInDLQ())
	if h.Swarm {
		r.Results = append(r.Results, ix.outcomes(), ix.origins(), ix.expiryHonoured())
	}
	if h.Mode == "ordering" || h.Ordering {
		r.Results = append(r.Results, ix.keyOrder())
	}
	if h.Events != nil {
		r.Results = append(r.Results, ix.outbox())
	}
	switch {
	case h.Transactional:
		r.Results = append(r.Results, ix.oncePerHop())
	case h.Swarm:
		r.Results = append(r.Results, ix.copies())
	}
	if h.HookDLQ || h.HookExpired {
		r.Results = append(r.Results, ix.hooks())
	}
	if h.AdaptiveMax > 0 {
		r.Results = append(r.Results, ix.adaptiveLimit())
	}
	if h.Swarm && h.Transactional {
		r.Results = append(r.Results, ix.txnIDsApart())
	}
	r.Results = append(r.Results, ix.noLag(), ix.processes())
	return r
}

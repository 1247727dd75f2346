package draw

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Excluded are the pairs of features that cannot be drawn together because
// the library refuses the combination at start (consumer.Config.Validate);
// the table marks them "x" and they do not count as missing.
var Excluded = [][2]Feature{{Ordering, RuleLadder}}

func excluded(a, b Feature) bool {
	for _, p := range Excluded {
		if (p[0] == a && p[1] == b) || (p[0] == b && p[1] == a) {
			return true
		}
	}
	return false
}

// Tally is what a run of seeds drew and found: the table each run ends with.
type Tally struct {
	Nodes      int
	Seeds      int
	Elapsed    time.Duration
	Feature    map[Feature]int    // seeds with the feature on
	Pair       map[[2]Feature]int // seeds with both on (the lower table index first)
	Faults     map[string]int     // faults injected, by kind
	Violations map[string]int     // seeds that broke each invariant
	Failed     []string           // the rerun arguments of each failing seed
}

// NewTally is an empty tally for a cluster of nodes.
func NewTally(nodes int) *Tally {
	return &Tally{Nodes: max(nodes, 1), Feature: map[Feature]int{}, Pair: map[[2]Feature]int{}, Faults: map[string]int{}, Violations: map[string]int{}}
}

// Add counts draw d (its faults as scheduled; the harness's own count of
// what it injected goes through AddFault instead when it differs).
func (t *Tally) Add(d *Draw) {
	t.Seeds++
	for i, a := range d.Features {
		t.Feature[a]++
		for _, b := range d.Features[i+1:] {
			t.Pair[pair(a, b)]++
		}
	}
	for _, f := range d.Faults {
		t.Faults[f.Kind]++
	}
}

// Fail records a failing seed: the invariants it broke and its rerun
// arguments.
func (t *Tally) Fail(args string, invariants []string) {
	t.Failed = append(t.Failed, args)
	for _, n := range invariants {
		t.Violations[n]++
	}
}

func pair(a, b Feature) [2]Feature {
	if slices.Index(Features, a) > slices.Index(Features, b) {
		a, b = b, a
	}
	return [2]Feature{a, b}
}

// Uncovered lists the features and fault kinds no seed has drawn yet, fault
// kinds first, each in table order.
func (t *Tally) Uncovered() []string {
	var out []string
	for _, k := range FaultKinds(t.Nodes) {
		if t.Faults[k] == 0 {
			out = append(out, k)
		}
	}
	for _, f := range Features {
		if t.Feature[f] == 0 {
			out = append(out, string(f))
		}
	}
	return out
}

// MissingPairs lists the pairs of features never drawn together, but for
// the Excluded ones.
func (t *Tally) MissingPairs() [][2]Feature {
	var out [][2]Feature
	for i, a := range Features {
		for _, b := range Features[i+1:] {
			if t.Pair[[2]Feature{a, b}] == 0 && !excluded(a, b) {
				out = append(out, [2]Feature{a, b})
			}
		}
	}
	return out
}

// ForceNext is what the next seed must force so that every feature and fault
// kind is drawn at least once over the remaining seeds (this one included):
// an even share of what is still uncovered, in table order, never both
// features of an Excluded pair (so a run needs two seeds at least).
func (t *Tally) ForceNext(remaining int) []string {
	u := t.Uncovered()
	if len(u) == 0 || remaining <= 0 {
		return nil
	}
	n := (len(u) + remaining - 1) / remaining
	var out []string
	for _, c := range u {
		if len(out) == n {
			break
		}
		// One of a pair the library refuses waits for the next seed.
		if slices.ContainsFunc(out, func(o string) bool { return excluded(Feature(o), Feature(c)) }) {
			continue
		}
		out = append(out, c)
	}
	return out
}

// ForcePair is what a soak's next seed forces so that every pair of
// features is drawn together: the two features of the first pair never
// drawn yet (nil when there is none).
func (t *Tally) ForcePair() []string {
	m := t.MissingPairs()
	if len(m) == 0 {
		return nil
	}
	return []string{string(m[0][0]), string(m[0][1])}
}

// Print writes the table: seeds, each feature's and each pair's count,
// faults by kind, violations and the failing seeds' rerun arguments.
func (t *Tally) Print(w io.Writer) {
	fmt.Fprintf(w, "== swarm table: %d seeds in %s\n", t.Seeds, t.Elapsed.Round(time.Second))
	fmt.Fprintf(w, "features drawn together (row × column; the diagonal: the feature alone; x: refused by the library):\n")
	width := 0
	for _, f := range Features {
		width = max(width, len(f))
	}
	fmt.Fprintf(w, "%*s ", width+3, "")
	for i := range Features {
		fmt.Fprintf(w, "%3d", i+1)
	}
	fmt.Fprintln(w)
	for i, a := range Features {
		fmt.Fprintf(w, "%2d %-*s ", i+1, width, a)
		for j, b := range Features {
			switch {
			case j > i:
				fmt.Fprint(w, "   ")
			case j == i:
				fmt.Fprintf(w, "%3d", t.Feature[a])
			case excluded(a, b):
				fmt.Fprint(w, "  x")
			default:
				fmt.Fprintf(w, "%3d", t.Pair[pair(a, b)])
			}
		}
		fmt.Fprintln(w)
	}
	missing := t.MissingPairs()
	total := len(Features)*(len(Features)-1)/2 - len(Excluded)
	fmt.Fprintf(w, "pairs drawn together: %d of %d", total-len(missing), total)
	if len(missing) > 0 && len(missing) <= 12 {
		var ms []string
		for _, p := range missing {
			ms = append(ms, string(p[0])+"×"+string(p[1]))
		}
		fmt.Fprintf(w, " (never: %s)", strings.Join(ms, ", "))
	}
	fmt.Fprintln(w)
	if u := t.Uncovered(); len(u) > 0 {
		fmt.Fprintf(w, "never drawn: %s\n", strings.Join(u, ", "))
	}
	fmt.Fprint(w, "faults by kind:")
	for _, k := range FaultKinds(t.Nodes) {
		fmt.Fprintf(w, " %s %d,", k, t.Faults[k])
	}
	fmt.Fprintln(w)
	if len(t.Violations) == 0 {
		fmt.Fprintln(w, "violations: none")
		return
	}
	fmt.Fprintf(w, "violations (seeds that broke each invariant), %d failing seeds:\n", len(t.Failed))
	names := make([]string, 0, len(t.Violations))
	for n := range t.Violations {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %3d  %s\n", t.Violations[n], n)
	}
	for _, a := range t.Failed {
		fmt.Fprintf(w, "  rerun: %s\n", a)
	}
}

// Shrink makes spec's failing draw smaller: it drops the draw's faults, one
// at a time in schedule order, then its features, in reverse table order,
// keeping each drop after which fails still reports a failure. It returns
// the smallest failing spec found. fails runs a spec (the harness); an
// error from it ends the shrink with what was found so far.
func Shrink(spec Spec, fails func(Spec) (bool, error), logf func(string, ...any)) (Spec, error) {
	d, err := Generate(spec)
	if err != nil {
		return spec, err
	}
	var cands []string
	for _, f := range d.Faults {
		cands = append(cands, f.ID)
	}
	for i := len(d.Features) - 1; i >= 0; i-- {
		cands = append(cands, string(d.Features[i]))
	}
	for _, c := range cands {
		next := without(spec, c)
		nd, err := Generate(next)
		if err != nil {
			return spec, err
		}
		if nd.JSON() == d.JSON() {
			continue // gone already (with a feature dropped before)
		}
		logf("shrink: without %s: %s", c, nd.Summary())
		f, err := fails(next)
		if err != nil {
			return spec, err
		}
		if f {
			logf("shrink: still fails without %s: dropped", c)
			spec, d = next, nd
		} else {
			logf("shrink: passes without %s: kept", c)
		}
	}
	return spec, nil
}

// without is spec with item c dropped (and no longer forced).
func without(spec Spec, c string) Spec {
	next := spec
	next.Force = slices.DeleteFunc(slices.Clone(spec.Force), func(s string) bool { return s == c })
	next.Drop = append(slices.Clone(spec.Drop), c)
	return next
}

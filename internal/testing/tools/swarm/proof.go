package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/idemhq/idem/internal/mutate"
	"github.com/idemhq/idem/internal/testing/chaos/draw"
)

// The checker's own proof (issue 28, item 5): for each invariant, the
// mechanism it guards is switched off (internal/mutate, members built with
// the tag idem_mutate), and the swarm must find the breach within a few
// seeds. A mechanism runs only when its feature is drawn, so each case
// forces the features (and fault kinds) without which it never runs, and
// drops those under which it never runs (an early mark is made only where
// offsets finish in order: no batches, no lanes); the rest of each seed is
// drawn as usual.

// proofCase is one mutation: the mechanism switched off, the invariant that
// must catch it, and what each of its seeds forces and drops.
type proofCase struct {
	name      string
	invariant string
	force     []string
	drop      []string
}

// proofCases are the mutations in the proof's order (mutate.Names).
var proofCases = []proofCase{
	{mutate.Inbox, "every unique key applied exactly once", nil, nil},
	{mutate.MarkEarly, "every record ends in one final outcome", []string{"tiers", "kill", "term", "slow"}, []string{"batch", "batch-handler", "lanes", "adaptive"}},
	{mutate.TxnMark, "each forward once per hop (read_committed)", []string{"transactions", "tiers", "term", "kill"}, nil},
	{mutate.Park, "each key's effects in produced order", []string{"ordering", "tiers", "skew"}, nil},
	{mutate.HookInbox, "hooks once per dead-lettered or expired message", []string{"hook-dead-lettered", "kill", "term"}, nil},
	{mutate.OwedHooks, "hooks once per dead-lettered or expired message", []string{"transactions", "hook-dead-lettered", "txn-abort", "kill"}, nil},
	{mutate.OriginTS, "every copy keeps its origin", []string{"tiers"}, nil},
	{mutate.Expiry, "no record handled past its deadline or age", []string{"expiry-deadline"}, nil},
	{mutate.Decide, "every record ends in one final outcome", []string{"transactions", "expiry-deadline", "expiry-age", "txn-abort", "kill", "broker-restart"}, nil},
	{mutate.Adaptive, "handler calls in flight within the adaptive limit", []string{"adaptive", "lanes", "slow"}, nil},
	{mutate.TxnID, "each transactional.id used by one group", []string{"txn-id-collision"}, nil},
	{mutate.Refusals, "no lag left", []string{"transactions", "refuse"}, nil},
	{mutate.Recover, "no process ended with an unexpected error", nil, nil},
	{mutate.OutboxSettle, "every outbox event published, applied once", []string{"outbox-exactly-once"}, nil},
}

// proofRow is what the proof found for one case.
type proofRow struct {
	c      proofCase
	seeds  int // seeds run
	found  bool
	caught bool     // the expected invariant was among those broken
	broke  []string // the invariants the failing seed broke
	rerun  string
}

// proof runs each case named in names ("all": every one) with up to k
// seeds each, from first, and prints the table; it returns 1 when a case
// was not found (a breach found by another invariant than the case's is
// found, and the table says so).
func (r *runner) proof(ctx context.Context, first draw.Spec, names []string, k int) int {
	cases := proofCases
	if !slices.Contains(names, "all") {
		cases = nil
		for _, n := range names {
			i := slices.IndexFunc(proofCases, func(c proofCase) bool { return c.name == n })
			if i < 0 {
				fmt.Fprintf(os.Stderr, "swarm: -proof %s: no such mutation (known: %s)\n", n, strings.Join(mutate.Names, ", "))
				return 2
			}
			cases = append(cases, proofCases[i])
		}
	}
	var rows []proofRow
	for _, c := range cases {
		row := proofRow{c: c}
		for i := range k {
			if ctx.Err() != nil {
				break
			}
			spec := first
			spec.Seed = first.Seed + uint64(i)
			spec.Force = append(slices.Clone(first.Force), c.force...)
			spec.Drop = append(slices.Clone(first.Drop), c.drop...)
			r.o.memberEnv = []string{mutate.Env + "=" + c.name}
			r.logf("proof: %s switched off, seed %d of %d", c.name, i+1, k)
			res, err := r.one(ctx, spec)
			if err != nil {
				fmt.Fprintln(os.Stderr, "swarm:", err)
				return 2
			}
			row.seeds = i + 1
			if !res.Report.OK() {
				row.found, row.broke, row.rerun = true, res.Report.Failed(), r.rerun(spec)
				row.caught = slices.Contains(row.broke, c.invariant)
				break
			}
		}
		rows = append(rows, row)
	}
	return printProof(rows, k, first)
}

// printProof prints the proof's table (the one docs/guarantees.md keeps).
func printProof(rows []proofRow, k int, first draw.Spec) int {
	code := 0
	fmt.Printf("\n== the checker's own proof: each mechanism switched off, up to %d seeds from seed %d (-ci %v)\n", k, first.Seed, first.CI)
	fmt.Println("| invariant | mechanism switched off (IDEM_MUTATE) | forced | seeds to find it | invariants broken |")
	fmt.Println("|---|---|---|---|---|")
	for _, row := range rows {
		found := fmt.Sprintf("not found in %d", row.seeds)
		if row.found {
			found = fmt.Sprintf("%d (seed %d)", row.seeds, first.Seed+uint64(row.seeds-1))
		}
		if !row.found {
			code = 1
		} else if !row.caught {
			found += ", not by its invariant"
		}
		forced := strings.Join(row.c.force, ", ")
		if forced == "" {
			forced = "—"
		}
		if len(row.c.drop) > 0 {
			forced += "; without " + strings.Join(row.c.drop, ", ")
		}
		fmt.Printf("| %s | `%s` | %s | %s | %s |\n", row.c.invariant, row.c.name, forced, found, strings.Join(row.broke, "; "))
	}
	for _, row := range rows {
		if row.found {
			fmt.Printf("rerun %s: %s\n", row.c.name, row.rerun)
		}
	}
	return code
}

// proofDefaults fills what -proof implies: members built with the
// mutation tag.
func (o *options) proofDefaults() {
	if !slices.Contains(strings.Split(o.tags, ","), "idem_mutate") {
		o.tags = strings.Trim(o.tags+",idem_mutate", ",")
	}
	if o.proofSeeds <= 0 {
		o.proofSeeds = 3
	}
}

package check

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// This file explains violations: timeline tells what happened to a key or
// a record, with the faults around it, and the helpers format coordinates
// and instants and order records and keys the same way in every report.

// timeline tells what happened to key (or, when key is empty, to record seq):
// what was produced, each handler call, each effect, each DLQ copy, and the
// faults around them, in time order.
func (ix *index) timeline(key string, seq int64) string {
	type line struct {
		at   time.Time
		text string
	}
	var ls []line
	for _, p := range ix.h.Produced {
		if (key != "" && p.Key == key) || p.Seq == seq {
			ls = append(ls, line{p.At, fmt.Sprintf("produced seq %d %s kind %s kafka-key %q order %q fail-first %d", p.Seq, coord(&p), p.Kind, p.KafkaKey, p.Order, p.FailFirst)})
		}
	}
	atts := ix.attemptSeq[seq]
	if key != "" {
		atts = ix.attempts[key]
	}
	for _, a := range atts {
		what := a.Outcome
		if a.Error != "" {
			what += ": " + a.Error
		}
		ls = append(ls, line{a.Start, fmt.Sprintf("%s handled seq %d read at %s/%d/%d attempt %d (batch of %d, %s): %s",
			a.Member, a.Seq, a.Topic, a.Partition, a.Offset, a.Attempt, a.Batch, a.End.Sub(a.Start).Round(time.Millisecond), what)})
	}
	for _, e := range ix.effects[key] {
		ls = append(ls, line{e.At, fmt.Sprintf("EFFECT id %d by %s: seq %d read at %s/%d/%d attempt %d", e.ID, e.Member, e.Seq, e.Topic, e.Partition, e.Offset, e.Attempt)})
	}
	var lo, hi time.Time
	for _, l := range ls {
		if lo.IsZero() || l.at.Before(lo) {
			lo = l.at
		}
		if l.at.After(hi) {
			hi = l.at
		}
	}
	for _, f := range ix.h.Faults {
		if !lo.IsZero() && !f.End.Before(lo.Add(-5*time.Second)) && !f.Start.After(hi.Add(5*time.Second)) {
			ls = append(ls, line{f.Start, fmt.Sprintf("fault %s %s (until %s)", f.Kind, f.Detail, clock(f.End))})
		}
	}
	slices.SortStableFunc(ls, func(a, b line) int { return a.at.Compare(b.at) })
	var b strings.Builder
	b.WriteString("timeline:")
	for _, l := range ls {
		fmt.Fprintf(&b, "\n  %s  %s", clock(l.at), l.text)
	}
	for _, d := range ix.dlq[seq] {
		fmt.Fprintf(&b, "\n  (DLQ)         DLQ %s%d/%d kind %s original %s/%s/%s error %q", topicPrefix(d.Topic), d.Partition, d.Offset,
			d.Headers["idem-error-kind"], d.Headers["idem-original-topic"], d.Headers["idem-original-partition"], d.Headers["idem-original-offset"], d.Headers["idem-error"])
	}
	if len(ls) == 0 && len(ix.dlq[seq]) == 0 {
		b.WriteString(" nothing recorded")
	}
	return b.String()
}

// before reports whether a was produced before b: earlier in the same
// partition (the order a consumer sees), else sent earlier.
func before(a, b *Produced) bool {
	if a.Topic == b.Topic && a.Partition == b.Partition {
		return a.Offset < b.Offset
	}
	return a.Seq < b.Seq
}

func coord(p *Produced) string { return fmt.Sprintf("%s/%d/%d", p.Topic, p.Partition, p.Offset) }

// topicPrefix is "topic " for a record of a named topic, "" otherwise.
func topicPrefix(topic string) string {
	if topic == "" {
		return ""
	}
	return topic + " "
}

func clock(t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	return t.UTC().Format("15:04:05.000")
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

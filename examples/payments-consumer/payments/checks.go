package payments

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idemhq/idem/dlq"
)

// This file is the demo's checks: the summary of a run, the figures read
// from PostgreSQL, Kafka and the metrics, and the check that they balance.

// summary is what a demo run reads back from PostgreSQL, Kafka, the bank's
// ledger and idem's metrics.
type summary struct {
	RunID, Topic, Group, DLQ string
	Partitions               int32
	Tiers                    []string

	Produced     int // every record sent
	GoodProduced int // good payments sent, duplicates included
	UniqueKeys   int // distinct good idempotency keys (= orders seeded)
	Bad          int // bad records sent

	Stored        int64 // payments rows of this run (PostgreSQL)
	OrdersPaid    int64 // orders of this run with status paid (PostgreSQL)
	DoubleCharges int64 // orders with >1 payment + keys with >1 row (PostgreSQL) + orders charged twice (bank)

	InboxDuplicates   int64 // idem_messages_total{outcome="duplicate"}: stopped by the inbox
	NaturalDuplicates int64 // stopped by the payments table's UNIQUE key

	TierRecords   []int64 // records in each retry tier topic (Kafka)
	TierForwarded []int64 // idem_forwarded_total to each tier
	InProcess     int64   // idem_retries_total: in-process retries

	DeadLettered int64       // records in the dead-letter topic (Kafka)
	DLQGroups    []dlq.Group // the DLQ's records grouped by failure (Kafka)
	DLQForwarded int64       // idem_forwarded_total to the DLQ

	Bank            bankFigures
	BreakerOpenings int64 // idem_breaker_transitions_total{name="bank",to="open"}
	Outages         int   // outage windows configured

	ProduceTime, ConsumeTime time.Duration

	Events eventFigures // payment.recorded events published through the outbox (events.go)
	Flow   flowFigures  // the bank's rate limit and 429s (flow.go)
}

// DuplicatesSkipped is the good deliveries that had no second effect.
func (s summary) DuplicatesSkipped() int64 { return int64(s.GoodProduced) - s.Stored }

// check returns an error listing every figure that does not balance.
func (s summary) check() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if s.Stored != int64(s.UniqueKeys) {
		bad("payments stored %d != unique keys %d", s.Stored, s.UniqueKeys)
	}
	if s.OrdersPaid != int64(s.UniqueKeys) {
		bad("orders paid %d != unique orders %d", s.OrdersPaid, s.UniqueKeys)
	}
	if s.DuplicatesSkipped() != s.InboxDuplicates+s.NaturalDuplicates {
		bad("duplicates skipped %d != inbox %d + natural key %d", s.DuplicatesSkipped(), s.InboxDuplicates, s.NaturalDuplicates)
	}
	if s.Bank.ChargedPrefix != s.Stored {
		bad("bank charges %d != payments stored %d", s.Bank.ChargedPrefix, s.Stored)
	}
	if s.DeadLettered != int64(s.Bad) {
		bad("dead-lettered %d != bad payments %d", s.DeadLettered, s.Bad)
	}
	if s.DeadLettered != s.DLQForwarded {
		bad("DLQ records %d != idem_forwarded_total to the DLQ %d", s.DeadLettered, s.DLQForwarded)
	}
	var grouped int64
	for _, g := range s.DLQGroups {
		grouped += g.Count
	}
	if grouped != s.DeadLettered {
		bad("DLQ records by reason %d != DLQ records %d", grouped, s.DeadLettered)
	}
	for i := range s.TierRecords {
		if s.TierRecords[i] != s.TierForwarded[i] {
			bad("tier %d: %d records != idem_forwarded_total %d", i+1, s.TierRecords[i], s.TierForwarded[i])
		}
	}
	if s.DoubleCharges != 0 {
		bad("double charges %d != 0", s.DoubleCharges)
	}
	if err := s.Events.check(s.Stored); err != nil {
		errs = append(errs, err)
	}
	if err := s.Flow.check(s.Bank.Flow); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s summary) print(w io.Writer) {
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-19s "+format+"\n", append([]any{label + ":"}, args...)...)
	}
	rate := float64(s.Produced) / max(s.ConsumeTime.Seconds(), 0.001)
	line("produced", "%s records (%s payments + %s duplicate deliveries + %d poison) in %s",
		num(int64(s.Produced)), num(int64(s.UniqueKeys)), num(int64(s.GoodProduced-s.UniqueKeys)), s.Bad, s.ProduceTime.Round(time.Millisecond))
	line("consumed", "all committed %s after the first was sent = %s msgs/s (%d partitions, one transaction per message)",
		s.ConsumeTime.Round(time.Millisecond), num(int64(rate)), s.Partitions)
	line("unique", "%s payments, one order each", num(int64(s.UniqueKeys)))
	line("applied", "%s payments stored, %s orders paid, %s bank charges", num(s.Stored), num(s.OrdersPaid), num(s.Bank.ChargedPrefix))
	line("duplicates skipped", "%s (inbox %s, natural key %s)", num(s.DuplicatesSkipped()), num(s.InboxDuplicates), num(s.NaturalDuplicates))
	var tiers []string
	for i, n := range s.TierRecords {
		tiers = append(tiers, fmt.Sprintf("tier %d: %s", i+1, num(n)))
	}
	line("retried", "%s in-process; %s", num(s.InProcess), strings.Join(tiers, ", "))
	line("bank", "%s calls, %s failed or timed out, %s answered from its idempotency ledger",
		num(s.Bank.Calls), num(s.Bank.Failed), num(s.Bank.Repeats))
	line("breaker openings", "%d (bank outages configured: %d)", s.BreakerOpenings, s.Outages)
	s.Flow.print(line, s.Bank.Flow)
	line("dead-lettered", "%s in %s", num(s.DeadLettered), s.DLQ)
	for _, g := range s.DLQGroups {
		msg := g.Message
		if len(msg) > 60 {
			msg = msg[:57] + "..."
		}
		fmt.Fprintf(w, "  %21s %4d  %-11s %s\n", "", g.Count, g.Kind, msg)
	}
	line("events published", "%s", s.Events)
	line("double charges", "%d", s.DoubleCharges)
}

// readKafkaFigures counts the records of the run's tier and dead-letter
// topics and groups the dead letters by failure (as `idem dlq list` does).
func readKafkaFigures(ctx context.Context, client sarama.Client, s *summary) error {
	var err error
	for _, t := range s.Tiers {
		n, err := countRecords(client, t)
		if err != nil {
			return fmt.Errorf("count records of %s: %w", t, err)
		}
		s.TierRecords = append(s.TierRecords, n)
	}
	if s.DeadLettered, err = countRecords(client, s.DLQ); err != nil {
		return fmt.Errorf("count DLQ records: %w", err)
	}
	if s.DLQGroups, err = dlq.New(client).List(ctx, s.DLQ); err != nil {
		return fmt.Errorf("list DLQ: %w", err)
	}
	return nil
}

// readFigures fills the PostgreSQL figures of s, scoped to its run.
func readFigures(ctx context.Context, pool *pgxpool.Pool, s *summary) error {
	prefix := s.RunID + "-%"
	err := pool.QueryRow(ctx, `
		SELECT
		  (SELECT count(*) FROM payments WHERE idempotency_key LIKE $1),
		  (SELECT count(*) FROM orders WHERE id LIKE $1 AND status = 'paid'),
		  (SELECT count(*) FROM (SELECT order_id FROM payments WHERE order_id LIKE $1
		                          GROUP BY order_id HAVING count(*) > 1) o)
		+ (SELECT count(*) FROM (SELECT idempotency_key FROM payments WHERE idempotency_key LIKE $1
		                          GROUP BY idempotency_key HAVING count(*) > 1) k)`,
		prefix).Scan(&s.Stored, &s.OrdersPaid, &s.DoubleCharges)
	if err != nil {
		return fmt.Errorf("read figures: %w", err)
	}
	return nil
}

// gatheredMetrics is one Gather of a registry.
type gatheredMetrics []*dto.MetricFamily

// gathered gathers reg (nil on error: every sum is then 0).
func gathered(reg prometheus.Gatherer) gatheredMetrics {
	mfs, _ := reg.Gather()
	return mfs
}

// sum adds up the counter or gauge name over the series whose label has
// value (every series when label is "").
func (g gatheredMetrics) sum(name, label, value string) int64 {
	if label == "" {
		return g.sumWhere(name, nil)
	}
	return g.sumWhere(name, map[string]string{label: value})
}

// find returns the value of the first series of name whose label has value.
func (g gatheredMetrics) find(name, label, value string) (int64, bool) {
	for _, mf := range g {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return int64(m.GetCounter().GetValue() + m.GetGauge().GetValue()), true
				}
			}
		}
	}
	return 0, false
}

// sumWhere adds up the counter or gauge name over the series whose labels
// include want.
func (g gatheredMetrics) sumWhere(name string, want map[string]string) int64 {
	return int64(g.sumFloat(name, want))
}

// sumFloat is sumWhere without rounding.
func (g gatheredMetrics) sumFloat(name string, want map[string]string) float64 {
	var sum float64
	for _, mf := range g {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			n := 0
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok {
					if v != l.GetValue() {
						continue series
					}
					n++
				}
			}
			if n != len(want) {
				continue
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// num formats n with thousands separators: 10000 → "10,000".
func num(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

package consumer

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/committed"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/wire"
)

// The lag of a claimed partition, three ways (issue 31, item 4), refreshed
// together every LagInterval by one goroutine, off the message path:
//
//   - idem_consumer_lag: the high watermark minus the group's committed
//     offset, as an outside tool (kafka-consumer-groups) shows it;
//   - idem_consumer_lag_actionable: the records a member could start now.
//     For a source topic, and for a deferred topic (whose records are
//     published when due), every record not yet committed; for a retry
//     tier, only those whose idem-due-at has come, found by reading a few
//     records (the due times of a tier grow with the offset: the consumer
//     handles a tier in order and waits for its head, so the due prefix is
//     what it can start, and a binary search finds its end); plus, for a
//     deferred topic's partition, the deferred messages already due in
//     PostgreSQL (idem_deferred, a scheduler behind or down);
//   - idem_consumer_lag_seconds: how long the oldest of those has waited:
//     since its timestamp (a source's or deferred topic's first uncommitted
//     record) or since it came due (a tier's head, a deferred row).
//
// So records parked in a ten-minute tier count in idem_consumer_lag and not
// in the actionable lag until they come due: an autoscaler on the latter
// adds members only for work a member can start (docs/kubernetes.md).

// lagPlan is what the lag watcher needs from Run's configuration.
type lagPlan struct {
	interval time.Duration
	// deferred are the deferred topics ("<source>.<group>.deferred"), whose
	// due rows in pool count as actionable; pool is nil without Config.Defer.
	deferred map[string]bool
	pool     *pgxpool.Pool
	// now is the watcher's clock (a test's, through its hooks).
	now func() time.Time
}

// lagPlan returns the plan of r's lag watcher; ctx carries the test hooks.
func (r *runner) lagPlan(ctx context.Context) lagPlan {
	p := lagPlan{interval: r.cfg.LagInterval, deferred: map[string]bool{}, now: time.Now}
	for _, t := range r.cfg.deferredTopics() {
		p.deferred[t] = true
	}
	if r.cfg.Defer != nil {
		p.pool = r.cfg.Defer.Pool
	}
	if h := hooksOf(ctx); h != nil && h.lagNow != nil {
		p.now = h.lagNow
	}
	return p
}

// watchLag refreshes the lag gauges of every claimed partition (sources,
// retry tiers and deferred topics) every plan.interval, and at once when a
// partition is claimed (so a series exists from the start), until ctx is
// done. The offsets are asked of the cluster. Series of partitions no longer
// claimed are removed.
func (cs *claimSet) watchLag(ctx context.Context, client sarama.Client, plan lagPlan) {
	if plan.interval < 0 {
		return
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		cs.log.Warn("idem: consumer lag disabled: admin client", "err", err)
		return
	}
	// Closing the admin would close the shared client; it holds no other resource.
	t := time.NewTicker(plan.interval)
	defer t.Stop()
	shown := map[tp]bool{}
	for {
		cs.refreshLag(ctx, client, admin, plan, shown)
		select {
		case <-ctx.Done():
			for k := range shown {
				cs.forgetLag(k)
			}
			return
		case <-t.C:
		case <-cs.kick:
		}
	}
}

// forgetLag removes the lag series of k.
func (cs *claimSet) forgetLag(k tp) {
	p := strconv.Itoa(int(k.partition))
	cs.m.ConsumerLag.DeleteLabelValues(cs.group, k.topic, p)
	cs.m.LagActionable.DeleteLabelValues(cs.group, k.topic, p)
	cs.m.LagSeconds.DeleteLabelValues(cs.group, k.topic, p)
}

// lagOf is one partition's lag, as refreshLag sets it.
type lagOf struct {
	offsets    int64   // idem_consumer_lag
	actionable int64   // idem_consumer_lag_actionable
	seconds    float64 // idem_consumer_lag_seconds
}

// refreshLag sets the lag of the partitions claimed now and removes the
// series in shown that are not claimed any more.
func (cs *claimSet) refreshLag(ctx context.Context, client sarama.Client, admin sarama.ClusterAdmin, plan lagPlan, shown map[tp]bool) {
	claimed := map[string][]int32{}
	parts := map[tp]*claim{}
	cs.parts.Range(func(k, v any) bool {
		t := k.(tp)
		claimed[t.topic] = append(claimed[t.topic], t.partition)
		parts[t] = v.(*claim)
		return true
	})
	for k := range shown {
		if parts[k] == nil {
			cs.forgetLag(k)
			delete(shown, k)
		}
	}
	if len(parts) == 0 || ctx.Err() != nil {
		return
	}
	resp, err := admin.ListConsumerGroupOffsets(cs.group, claimed)
	if err != nil {
		cs.log.Debug("idem: consumer lag: committed offsets", "err", err)
		return
	}
	now := plan.now()
	rows := cs.dueDeferred(ctx, plan, now)
	for k, p := range parts {
		if ctx.Err() != nil {
			return
		}
		hwm, err := client.GetOffset(k.topic, k.partition, sarama.OffsetNewest)
		if err != nil {
			cs.log.Debug("idem: consumer lag: high watermark", "topic", k.topic, "partition", k.partition, "err", err)
			continue
		}
		committedAt := int64(-1)
		if b := resp.GetBlock(k.topic, k.partition); b != nil && b.Err == sarama.ErrNoError {
			committedAt = b.Offset
		}
		if committedAt < 0 { // nothing committed yet: where the claim started
			committedAt = p.kc.InitialOffset()
			if committedAt == sarama.OffsetOldest {
				if committedAt, err = client.GetOffset(k.topic, k.partition, sarama.OffsetOldest); err != nil {
					continue
				}
			}
		}
		if committedAt < 0 { // started at the newest offset: no figure until a commit
			continue
		}
		l := lagOf{offsets: max(hwm-committedAt, 0)}
		if l.offsets > 0 {
			if p.tier && !plan.deferred[k.topic] {
				err = cs.tierLag(client, k, committedAt, hwm, now, &l)
			} else {
				err = cs.headLag(client, k, committedAt, hwm, now, &l)
			}
			if err != nil {
				cs.log.Debug("idem: consumer lag: read the partition's head", "topic", k.topic, "partition", k.partition, "err", err)
			}
		}
		if d, ok := rows[k]; ok {
			l.actionable += d.n
			l.seconds = max(l.seconds, now.Sub(d.oldest).Seconds())
		}
		if _, ok := cs.parts.Load(k); !ok {
			continue // revoked meanwhile
		}
		part := strconv.Itoa(int(k.partition))
		cs.m.ConsumerLag.WithLabelValues(cs.group, k.topic, part).Set(float64(l.offsets))
		cs.m.LagActionable.WithLabelValues(cs.group, k.topic, part).Set(float64(l.actionable))
		cs.m.LagSeconds.WithLabelValues(cs.group, k.topic, part).Set(l.seconds)
		shown[k] = true
	}
}

// headLag fills l for a partition whose every uncommitted record is
// actionable (a source or a deferred topic): all of them, and the age of the
// first. On an error l keeps the count and no age.
func (cs *claimSet) headLag(client sarama.Client, k tp, from, end int64, now time.Time, l *lagOf) error {
	l.actionable = l.offsets
	head, err := committed.First(client, k.topic, k.partition, from, end)
	if err != nil || head == nil || head.Timestamp.IsZero() {
		return err
	}
	l.seconds = max(now.Sub(head.Timestamp).Seconds(), 0)
	return nil
}

// tierLag fills l for a retry tier: the records of [from, end) already due
// at now, and how long the first has been due. Due times grow with the
// offset (each tier has one delay, and records are forwarded in time
// order), so the due records are a prefix and a binary search over single
// records finds its end: a few small fetches, whatever the tier holds. A
// record without idem-due-at (replayed to the tier by hand) is due. A
// record replayed onto a tier behind later ones breaks the order; the
// count is then an estimate, and the head still decides what the consumer
// can start.
func (cs *claimSet) tierLag(client sarama.Client, k tp, from, end int64, now time.Time, l *lagOf) error {
	due := func(m *sarama.ConsumerMessage) (time.Time, bool) {
		f, _, _ := wire.Decode(m.Headers)
		return f.DueAt, !f.DueAt.After(now)
	}
	head, err := committed.First(client, k.topic, k.partition, from, end)
	if err != nil || head == nil {
		return err
	}
	at, ok := due(head)
	if !ok {
		return nil
	}
	if !at.IsZero() {
		l.seconds = max(now.Sub(at).Seconds(), 0)
	}
	// lo holds a due record; no offset at or past hi holds one.
	lo, hi := head.Offset, end
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		m, err := committed.First(client, k.topic, k.partition, mid, hi)
		if err != nil {
			return err
		}
		if m == nil {
			hi = mid // only markers (or undecided records) in [mid, hi)
			continue
		}
		if _, ok := due(m); ok {
			lo = m.Offset
		} else {
			hi = mid // [mid, m.Offset) holds no record
		}
	}
	l.actionable = hi - from
	return nil
}

// dueRows are the deferred messages of one deferred topic's partition due
// at now, and when the first came due.
type dueRows struct {
	n      int64
	oldest time.Time
}

// dueDeferred counts the group's deferred messages due at now in
// PostgreSQL, by the deferred topic and partition their copy goes to: one
// query through the (consumer_group, due_at) index, none without
// Config.Defer. A failure is logged and counts none.
func (cs *claimSet) dueDeferred(ctx context.Context, plan lagPlan, now time.Time) map[tp]dueRows {
	if plan.pool == nil {
		return nil
	}
	rows, err := plan.pool.Query(ctx, `SELECT topic, partition, count(*), min(due_at) FROM `+tables.DeferredTable+`
		WHERE consumer_group = $1 AND due_at <= $2 GROUP BY topic, partition`, cs.group, now)
	if err != nil {
		cs.log.Debug("idem: consumer lag: due deferred messages", "err", err)
		return nil
	}
	defer rows.Close()
	out := map[tp]dueRows{}
	for rows.Next() {
		var k tp
		var d dueRows
		if err := rows.Scan(&k.topic, &k.partition, &d.n, &d.oldest); err != nil {
			cs.log.Debug("idem: consumer lag: due deferred messages", "err", err)
			return nil
		}
		out[k] = d
	}
	if err := rows.Err(); err != nil {
		cs.log.Debug("idem: consumer lag: due deferred messages", "err", err)
		return nil
	}
	return out
}

// watchDLQDepth exports idem_dlq_depth for each source topic's dead-letter
// topic every DLQDepthInterval, until ctx is done.
func watchDLQDepth(ctx context.Context, client sarama.Client, cfg Config, depth *prometheus.GaugeVec, log *slog.Logger) {
	if cfg.DLQDepthInterval < 0 {
		return
	}
	d := dlq.New(client)
	t := time.NewTicker(cfg.DLQDepthInterval)
	defer t.Stop()
	for {
		for _, topic := range cfg.Topics {
			for _, name := range cfg.dlqTopics(topic) { // the fallback's and each rule's
				n, err := d.Depth(ctx, name)
				if err != nil {
					if ctx.Err() == nil {
						log.Debug("idem: DLQ depth", "topic", name, "err", err)
					}
					continue
				}
				depth.WithLabelValues(name).Set(float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/retrytopic"
)

// Ordering says whether a message in a retry tier may be overtaken by later
// messages of its Kafka key.
type Ordering int

const (
	// OrderingNone lets later messages of a key flow on while an earlier one
	// waits in a retry tier: the highest throughput, and per-key order is lost
	// for retried messages (as in Spring Kafka's retry topics). The default.
	OrderingNone Ordering = iota
	// OrderingByKey keeps per-key order (by the Kafka record key): while a
	// message of key K sits in a retry tier, later messages of K are parked
	// behind it (idem_messages_total{outcome="parked"}) instead of overtaking
	// it; when K's message succeeds or is dead-lettered, the parked ones follow
	// in their original order. Other keys flow on. The parked keys and the
	// parked messages (payload and headers) are stored in PostgreSQL
	// (Config.OrderingDB), so they survive restarts and rebalances: the new
	// owner of a partition first finishes a forward its previous owner left
	// pending. Keys of any length are indexed by their SHA-256; header names
	// and values are kept byte for byte. Records with an empty Kafka key are
	// not ordered.
	//
	// Two workers handling one key at once (a redelivery racing its tier
	// record, one key on two partitions) never loop: a message that fails
	// while another became the head goes to its tier anyway and is parked
	// behind that head when it comes back. A step the database refuses for
	// good (SQLSTATE 22, 23, 54, …) is logged at ERROR and skipped; see
	// orderError for each outcome.
	//
	// Parked messages whose head will never come back (ordering switched off
	// later, the head's tier removed from Retry.Delays or expired by
	// retention) have committed offsets: Run warns about them at start, and
	// `idem ordering list` and `idem ordering release` show and send them on.
	OrderingByKey
)

// String returns "none" or "by-key".
func (o Ordering) String() string {
	switch o {
	case OrderingNone:
		return "none"
	case OrderingByKey:
		return "by-key"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// The ordering store's errors, classified (orderErrorOf). Every step of the
// ordering store (park, block, drain, promote, recover) ends in exactly one
// of these; none retries for ever on an input:
//
//   - outage: no SQLSTATE (the connection failed, the server went away), an
//     outage SQLSTATE (sqlClass: 08, 57P01–57P03, 53300, 58) or a transaction
//     conflict (40: serialization failure, deadlock). The step is retried with
//     backoff on the same message, counted in idem_store_errors_total, until
//     it succeeds or the partition stops.
//   - conflict: keyorder.ErrOtherHead, another worker made another message
//     the key's head (two copies of one message handled at once, a
//     redelivery racing its tier record, or one key on two partitions).
//     Retrying cannot help. A message that failed and could not become the
//     head is forwarded to its retry tier anyway; when it comes back it is
//     parked behind the head (or processed, when the key is free by then). A
//     drain whose promotion lost stops: the other worker owns the key now.
//   - fault: any other SQLSTATE (22 data, 23 integrity, 54 program limit,
//     42 undefined table, …) or a record the store cannot encode: the same
//     input fails the same way every time. It is logged at ERROR and the step
//     is skipped: a message that cannot be parked is processed unordered; a
//     message that cannot become the head goes to its tier unordered; a drain
//     that cannot read, remove or promote a parked message stops and leaves
//     the key blocked with its parked messages in place, which
//     `idem ordering list` shows and `idem ordering release` sends on.
type orderError int

const (
	orderOutage orderError = iota
	orderConflict
	orderFault
)

func (c orderError) String() string { return [...]string{"outage", "conflict", "fault"}[c] }

// orderErrorOf classifies an ordering-store error; see orderError.
func orderErrorOf(err error) orderError {
	if errors.Is(err, keyorder.ErrOtherHead) {
		return orderConflict
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		var je *json.UnsupportedValueError
		var jt *json.UnmarshalTypeError
		var js *json.SyntaxError
		if errors.As(err, &je) || errors.As(err, &jt) || errors.As(err, &js) {
			return orderFault
		}
		return orderOutage
	}
	if sqlClass(pe.Code) == classOutage || strings.HasPrefix(pe.Code, "40") {
		return orderOutage
	}
	return orderFault
}

// orderTry runs a step of the ordering store, retrying it through outages
// only. It returns nil when the step succeeded, the error when it ended in a
// conflict or a fault (not retried; see orderError), and ok=false when the
// partition is stopping.
func (p *partition) orderTry(step string, f func(ctx context.Context) error) (err error, ok bool) {
	for n := 1; ; n++ {
		err := f(p.hctx)
		if err == nil {
			return nil, true
		}
		switch orderErrorOf(err) {
		case orderConflict:
			p.log.Warn("idem: ordering conflict: another worker holds the key's head", "step", step, "err", err)
			return err, true
		case orderFault:
			p.log.Error("idem: ordering store refused the step; not retrying it", "step", step, "err", err)
			return err, true
		}
		p.r.m.StoreErrors.WithLabelValues(p.r.cfg.Group).Inc()
		p.log.Warn("idem: ordering store unavailable; retrying", "step", step, "err", err, "try", n)
		if !sleep(p.stopCtx, p.r.outageDelay(n)) {
			return err, false
		}
	}
}

// orderStep is orderTry for steps whose conflict or fault the caller takes
// as done (see orderError for what follows); false means the partition is
// stopping.
func (p *partition) orderStep(f func(ctx context.Context) error) bool {
	_, ok := p.orderTry("block", f)
	return ok
}

// park parks cm behind its key's head when the key is blocked by another
// message; parked=false means process it now (also when the store refused to
// park it: it is then processed unordered).
func (p *partition) park(cm *sarama.ConsumerMessage, msg *handler.Message, o origin) (parked, ok bool) {
	rec := keyorder.Record{
		Topic: o.topic, Key: cm.Key, IdempotencyKey: msg.IdempotencyKey,
		Partition: o.partition, Offset: o.offset, Timestamp: cm.Timestamp, Value: cm.Value,
	}
	for _, h := range cm.Headers {
		if h != nil {
			rec.Headers = append(rec.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
		}
	}
	var st keyorder.State
	err, ok := p.orderTry("park", func(ctx context.Context) (err error) {
		st, err = p.r.order.Park(ctx, rec)
		return err
	})
	if !ok {
		return false, false
	}
	if err != nil {
		p.log.Error("idem: cannot park; processing the message unordered", "offset", cm.Offset, "key", msg.IdempotencyKey)
		return false, true
	}
	if st == keyorder.Blocked {
		p.log.Debug("idem: parked behind an earlier message of its key", "offset", cm.Offset, "key", msg.IdempotencyKey)
	}
	return st == keyorder.Blocked, true
}

// orderHooks lets this package's tests act at exact points of the ordering
// steps; Run's ctx carries it (withOrderHooks) and nothing else sets it.
type orderHooks struct {
	// promoted runs after a parked message was promoted to head and before
	// its forward, with the partition's stop and handler contexts.
	promoted func(stop, hctx context.Context, r keyorder.Record)
	// draining runs after Next returned r and before the drain starts it.
	draining func(stop, hctx context.Context, r keyorder.Record)
}

type orderHooksKey struct{}

func withOrderHooks(ctx context.Context, h *orderHooks) context.Context {
	return context.WithValue(ctx, orderHooksKey{}, h)
}

func (p *partition) hooks() *orderHooks {
	h, _ := p.hctx.Value(orderHooksKey{}).(*orderHooks)
	if h == nil {
		return &orderHooks{}
	}
	return h
}

// stuck logs a key a drain leaves blocked because the store refused a step.
func (p *partition) stuck(topic string, key []byte, head string) {
	p.log.Error("idem: key left blocked with its parked messages; release them with idem ordering release",
		"source", topic, "head", head,
		"release", fmt.Sprintf("idem ordering release --group %s --topic %s --key-hex %x --to source", p.r.cfg.Group, topic, key))
}

// drain runs the messages parked behind head (now processed or
// dead-lettered) in their order. A parked message that fails retriably becomes
// the key's new head and goes to the first retry tier; the rest stay parked
// behind it. When that tier refuses it for good and it is dead-lettered
// instead (forward), it will not come back: the drain goes on behind it. It
// returns false when the partition is stopping: the head is then not marked,
// and its redelivery drains again. Once the partition is stopping it starts
// no further parked message, even within the shutdown grace.
func (p *partition) drain(topic string, key []byte, head string) bool {
	r := p.r
	hooks := p.hooks()
	for {
		var next keyorder.Record
		var more bool
		err, ok := p.orderTry("next", func(ctx context.Context) (err error) {
			next, more, err = r.order.Next(ctx, topic, key, head)
			return err
		})
		if !ok {
			return false
		}
		if err != nil {
			p.stuck(topic, key, head)
			return true
		}
		if !more {
			return true
		}
		if hooks.draining != nil {
			hooks.draining(p.stopCtx, p.hctx, next)
		}
		if p.stopCtx.Err() != nil {
			return false // revoked or shutting down: start nothing new
		}
		msg, headers := parkedMessage(next)
		rec := dedupe.Record{Group: r.cfg.Group, Key: next.IdempotencyKey, Topic: next.Topic, Partition: next.Partition, Offset: next.Offset}
		err, ok = p.process(rec, msg, nil)
		if !ok {
			return false
		}
		done := func() bool {
			err, ok := p.orderTry("done", func(ctx context.Context) error { return r.order.Done(ctx, next.Seq) })
			if ok && err != nil {
				p.stuck(topic, key, head)
				return false
			}
			return ok
		}
		if err == nil {
			if !done() {
				return p.stopCtx.Err() == nil
			}
			continue
		}
		src := retrytopic.Source{Topic: next.Topic, Partition: next.Partition, Offset: next.Offset, Timestamp: next.Timestamp, Group: r.cfg.Group}
		out := p.failure(src, next.Key, next.Value, headers, origin{topic: next.Topic, partition: next.Partition, offset: next.Offset}, msg, err)
		if out.tier == 0 {
			if !p.send(out, msg) {
				return false
			}
			if !done() {
				return p.stopCtx.Err() == nil
			}
			continue
		}
		// The parked message becomes the head: promote it (recording the
		// forward as pending) in one transaction, then forward it.
		pending := next
		pending.Tier = out.tier
		pending.Headers = pending.Headers[:0:0]
		for _, h := range out.rec.Headers {
			pending.Headers = append(pending.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
		}
		err, ok = p.orderTry("promote", func(ctx context.Context) error { return r.order.Promote(ctx, head, pending) })
		switch {
		case !ok:
			return false
		case orderErrorOf(err) == orderConflict:
			// Another worker drained this key at the same time and promoted
			// first: it forwards the new head; this head is done.
			return true
		case err != nil:
			p.stuck(topic, key, head)
			return true
		}
		if hooks.promoted != nil {
			hooks.promoted(p.stopCtx, p.hctx, pending)
		}
		head = next.IdempotencyKey
		again, ok := p.forwardHead(out, msg, next.Topic, next.Key, head)
		if !again {
			return ok
		}
	}
}

// forwardHead forwards out, the record of the key's head ikey whose forward
// is recorded as pending, and clears the pending mark. again reports that
// the head was dead-lettered instead (its tier refused it for good): it will
// not come back from a tier, so the caller drains the messages parked behind
// it now. ok is false when the partition is stopping: the forward stays
// pending and the next owner of the partition does it (claimOrdering).
func (p *partition) forwardHead(out outbound, msg *handler.Message, topic string, key []byte, ikey string) (again, ok bool) {
	sent, ok := p.forward(out, msg)
	if !ok {
		return false, false
	}
	if _, ok = p.orderTry("forwarded", func(ctx context.Context) error {
		return p.r.order.Forwarded(ctx, topic, key, ikey)
	}); !ok {
		return false, false
	}
	return sent.tier == 0, true
}

// parkedMessage rebuilds the handler message and headers of a parked record.
func parkedMessage(rec keyorder.Record) (*handler.Message, []*sarama.RecordHeader) {
	msg := &handler.Message{
		Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: rec.Key, Value: rec.Value, Timestamp: rec.Timestamp,
		IdempotencyKey: rec.IdempotencyKey, Attempt: 1,
	}
	hs := make([]*sarama.RecordHeader, 0, len(rec.Headers))
	for _, h := range rec.Headers {
		msg.Headers = append(msg.Headers, handler.Header{Key: h.Key, Value: h.Value})
		hs = append(hs, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	return msg, hs
}

// pendingOutbound is the forward a promoted head still owes: the record
// Promote stored, to its tier, with its family's dead-letter topic for when
// the tier refuses it for good.
func (r *runner) pendingOutbound(rec keyorder.Record) outbound {
	hs := make([]sarama.RecordHeader, 0, len(rec.Headers))
	for _, h := range rec.Headers {
		hs = append(hs, sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
	}
	tier := max(rec.Tier, 1)
	f, _, _ := retrytopic.Decode(hs)
	f.Tier = tier
	if f.IdempotencyKey == "" {
		f.IdempotencyKey = rec.IdempotencyKey
	}
	return outbound{
		rec: retrytopic.Record{
			Topic: r.policy.Tier(rec.Topic, r.cfg.Group, tier), Partition: rec.Partition,
			Key: rec.Key, Value: rec.Value, Headers: hs,
		},
		tier: tier,
		kind: string(f.Kind),
		f:    f,
		dlq:  r.policy.DLQ(rec.Topic, r.cfg.Group),
	}
}

// tierGone reports (and logs) a pending head whose tier Retry.Delays no
// longer has: it is not forwarded (its topic may be gone, and nothing would
// read it); warnUnread names it and `idem ordering release` sends it on.
func (r *runner) tierGone(rec keyorder.Record) bool {
	if rec.Tier <= len(r.policy.Delays) {
		return false
	}
	r.log.Warn("idem: not forwarding a pending head: its retry tier is no longer configured", "key", rec.IdempotencyKey,
		"tier", rec.Tier, "tiers", len(r.policy.Delays),
		"release", fmt.Sprintf("idem ordering release --group %s --topic %s --key-hex %x --to source", r.cfg.Group, rec.Topic, rec.Key))
	return true
}

// sourceOf returns the source topic a subscribed topic belongs to: itself, or
// the source whose retry tier it is.
func (r *runner) sourceOf(topic string) (string, bool) {
	for _, t := range r.cfg.Topics {
		if t == topic || slices.Contains(r.policy.Tiers(t, r.cfg.Group), topic) {
			return t, true
		}
	}
	return "", false
}

// claimOrdering runs when the partition is claimed, before its first message:
// it finishes the ordering store's work a previous owner left for this
// partition, the one recovery path of a pending head. A drain that promoted a
// parked message and was revoked (or crashed) before forwarding it left the
// forward pending; the new owner of the partition — of the source topic or of
// one of its tiers, whichever is claimed first — forwards it now, so the key
// is not blocked for ever (a forward done twice is harmless: the inbox
// absorbs the copy). A head its tier refuses for good is dead-lettered
// (forward) and the messages parked behind it are drained. The partition's
// reader runs already, so a revoke stops this at once. false means the
// partition is stopping.
func (p *partition) claimOrdering() bool {
	r := p.r
	src, ok := r.sourceOf(p.tp.topic)
	if !ok {
		return true
	}
	var pending []keyorder.Record
	err, ok := p.orderTry("claim", func(ctx context.Context) (err error) {
		pending, err = r.order.PendingOf(ctx, src, p.tp.partition)
		return err
	})
	if !ok {
		return false
	}
	if err != nil {
		return true // logged; the next claim tries again
	}
	for _, rec := range pending {
		if r.tierGone(rec) {
			continue
		}
		msg := &handler.Message{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, IdempotencyKey: rec.IdempotencyKey}
		again, ok := p.forwardHead(r.pendingOutbound(rec), msg, rec.Topic, rec.Key, rec.IdempotencyKey)
		if !ok {
			return false
		}
		p.log.Info("idem: forwarded a head whose forward a previous owner left pending", "key", rec.IdempotencyKey, "source", src)
		if again && !p.drain(rec.Topic, rec.Key, rec.IdempotencyKey) {
			return false
		}
	}
	return true
}

// orderingDB is where the parked rows of this group live: Config.OrderingDB,
// else the database of a Dedupe store that exposes one (DB() dedupe.DB);
// nil when neither is known.
func (r *runner) orderingDB() dedupe.DB {
	if r.cfg.OrderingDB != nil {
		return r.cfg.OrderingDB
	}
	if d, ok := r.cfg.Dedupe.(interface{ DB() dedupe.DB }); ok {
		return d.DB()
	}
	return nil
}

// warnUnread logs at WARN, at start, the parked messages of this group that
// this Run will not read, with counts, topics and the command that releases
// them: all of them when ordering is off; with OrderingByKey, those of topics
// not in Config.Topics, those whose head sits in a retry tier beyond
// len(Retry.Delays) (removed from the policy), and those whose head has
// waited in its tier longer than the tier topic keeps records (retention.ms):
// its tier record expired, so it never comes back. Their offsets are
// committed, so without a release they stay stranded. It never fails Run: a
// database it cannot read (or without the ordering tables) is skipped.
func (r *runner) warnUnread(ctx context.Context, client sarama.Client) {
	db := r.orderingDB()
	if db == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys, err := keyorder.List(ctx, db, r.cfg.Group, "")
	if err != nil {
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "42P01" { // undefined_table: ordering never used here
			r.log.Debug("idem: cannot look for parked messages", "err", err)
		}
		return
	}
	type unread struct {
		keys, parked int
		oldest       time.Time
		reason       string
	}
	var topics []string
	byTopic := map[string]*unread{}
	var retention map[string]time.Duration // of the tier topics, read once when needed
	for _, k := range keys {
		var reason string
		switch {
		case r.order == nil:
			reason = "ordering is off (Config.Ordering is not OrderingByKey)"
		case !slices.Contains(r.cfg.Topics, k.Topic):
			reason = "the topic is not in Config.Topics"
		case k.Tier > len(r.policy.Delays):
			reason = fmt.Sprintf("heads wait in retry tier %d, but Retry.Delays has %d tiers", k.Tier, len(r.policy.Delays))
		case k.Head != "" && !k.Pending && k.Tier > 0 && !k.Since.IsZero():
			tier := r.policy.Tier(k.Topic, r.cfg.Group, k.Tier)
			if retention == nil {
				retention = r.retentions(client, r.topics()[len(r.cfg.Topics):])
			}
			d, ok := retention[tier]
			if !ok || d < 0 || time.Since(k.Since) <= d {
				continue
			}
			reason = fmt.Sprintf("heads waited in retry tier %d longer than its retention.ms (%s): their tier records expired", k.Tier, d)
		default:
			continue
		}
		u := byTopic[k.Topic]
		if u == nil {
			u = &unread{reason: reason}
			byTopic[k.Topic] = u
			topics = append(topics, k.Topic)
		}
		u.keys++
		u.parked += k.Parked
		if !k.OldestParked.IsZero() && (u.oldest.IsZero() || k.OldestParked.Before(u.oldest)) {
			u.oldest = k.OldestParked
		}
	}
	for _, t := range topics {
		u := byTopic[t]
		age := time.Duration(0)
		if !u.oldest.IsZero() {
			age = time.Since(u.oldest).Round(time.Second)
		}
		r.log.Warn("idem: parked messages this consumer will not read; their offsets are committed, so release them",
			"topic", t, "keys", u.keys, "parked", u.parked, "oldest_age", age, "reason", u.reason,
			"list", fmt.Sprintf("idem ordering list --group %s --topic %s", r.cfg.Group, t),
			"release", fmt.Sprintf("idem ordering release --group %s --topic %s --all --to source", r.cfg.Group, t))
	}
}

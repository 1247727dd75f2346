package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/keyorder"
	"github.com/idemhq/idem/internal/mutate"
)

// Ordering says whether a message in a retry tier may be overtaken by later
// messages of its Kafka key. The zero Ordering lets later messages of a key
// flow on while an earlier one waits in a retry tier: the highest throughput,
// and per-key order is lost for retried messages (as in Spring Kafka's retry
// topics). ByKey keeps per-key order.
type Ordering struct {
	keyed bool      // made by ByKey
	db    dedupe.DB // ByKey's database
}

// ByKey keeps per-key order (by the Kafka record key): while a message of
// key K sits in a retry tier, later messages of K are parked behind it
// (idem_messages_total{outcome="parked"}) instead of overtaking it; when K's
// message succeeds or is dead-lettered, the parked ones follow in their
// original order. Other keys flow on. The parked keys and the parked
// messages (payload and headers) are stored in PostgreSQL in db, usually the
// dedupe store's pool (its tables are created at start), so they survive
// restarts and rebalances: the new owner of a partition first finishes a
// forward its previous owner left pending. Keys of any length are indexed by
// their SHA-256; header names and values are kept byte for byte. Records
// with an empty Kafka key are not ordered. A nil db is a Validate error.
//
// The head is one record: a producer's duplicate of it (the head's
// idempotency key, produced again at another offset) is parked behind it
// like any later message of K, and is a duplicate when its turn comes.
//
// Two workers handling one key at once (a redelivery racing its tier
// record, one key on two partitions) never loop: a message that fails while
// another became the head goes to its tier anyway and is parked behind that
// head when it comes back. A step the database refuses for good (SQLSTATE
// 22, 23, 54, …) is logged at ERROR and skipped; see orderError for each
// outcome.
//
// Parked messages whose head will never come back (ordering switched off
// later, the head's tier removed from Retry.Tiers.Delays or expired by
// retention) have committed offsets: Run warns about them at start, and
// `idem ordering list` and `idem ordering release` show and send them on.
func ByKey(db dedupe.DB) Ordering { return Ordering{keyed: true, db: db} }

// String returns "none" or "by-key".
func (o Ordering) String() string {
	if o.keyed {
		return "by-key"
	}
	return "none"
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
//   - fenced: keyorder.ErrFenced, with Transactions: another claim of the
//     partition came since this one's (the member lost the partition, frozen
//     past its session timeout or replaced by a member with its InstanceID),
//     so its Kafka transaction cannot commit, and the marked step was refused
//     with nothing written. The partition stops here (errStopping); the new
//     owner reads the message again.
type orderError int

const (
	orderOutage orderError = iota
	orderConflict
	orderFault
	orderFenced
)

func (c orderError) String() string {
	return [...]string{"outage", "conflict", "fault", "fenced"}[c]
}

// orderErrorOf classifies an ordering-store error; see orderError.
func orderErrorOf(err error) orderError {
	if errors.Is(err, keyorder.ErrOtherHead) {
		return orderConflict
	}
	if errors.Is(err, keyorder.ErrFenced) {
		return orderFenced
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

// keyOrder is what Config.Ordering adds to the path of a message with Kafka
// key key: orderOff (no ordering, and records without a Kafka key) adds
// nothing; byKey (ByKey) keeps per-key order through the ordering
// store. The message path calls the three steps unconditionally. Each
// returns errStopping when the partition is stopping, and no other error.
type keyOrder interface {
	// admit parks the message behind its key's head when the key has one
	// (parked: the message is done here and its offset may be marked). An
	// expired message is never parked, but skipped as parked all the same
	// when the ordering store holds it already (a redelivered copy).
	admit(cm *sarama.ConsumerMessage, msg *handler.Message, o origin, expired bool) (parked bool, err error)
	// toTier makes the record at o, with idempotency key ikey, its key's
	// head before it is forwarded to tier.
	toTier(o origin, key []byte, ikey string, tier int) error
	// settled runs once ikey, the claim's message at offset at (its record
	// first produced at o), reached its outcome here (processed, duplicate,
	// dead-lettered): the messages parked behind it follow.
	settled(o origin, key []byte, ikey string, at int64) error
}

// orderOf returns the keyOrder of cm.
func (w *worker) orderOf(cm *sarama.ConsumerMessage) keyOrder {
	if w.r.order == nil || len(cm.Key) == 0 {
		return orderOff{}
	}
	return byKey{w}
}

// orderOff is the zero Ordering: every step is a no-op.
type orderOff struct{}

func (orderOff) admit(*sarama.ConsumerMessage, *handler.Message, origin, bool) (bool, error) {
	return false, nil
}
func (orderOff) toTier(origin, []byte, string, int) error    { return nil }
func (orderOff) settled(origin, []byte, string, int64) error { return nil }

// byKey is ByKey for one worker: the steps of the ordering store
// (see the Ordering doc), run by w.
type byKey struct{ *worker }

func (w byKey) admit(cm *sarama.ConsumerMessage, msg *handler.Message, o origin, expired bool) (bool, error) {
	return w.park(cm, msg, o, expired)
}

func (w byKey) toTier(o origin, key []byte, ikey string, tier int) error {
	at := keyorder.Origin{Partition: o.partition, Offset: o.offset}
	return w.orderStep(func(ctx context.Context) error { return w.r.order.BlockAt(ctx, o.topic, key, ikey, at, tier) })
}

func (w byKey) settled(o origin, key []byte, ikey string, at int64) error {
	return w.drain(o.topic, key, ikey, keyorder.Origin{Partition: o.partition, Offset: o.offset}, at)
}

// orderTry runs a step of the ordering store, retrying it through outages
// only. refused is nil when the step succeeded, else the error it ended in:
// a conflict or a fault (not retried; see orderError). err is errStopping
// when the partition is stopping, and nil otherwise.
func (w byKey) orderTry(step string, f func(ctx context.Context) error) (refused, err error) {
	for n := 1; ; n++ {
		err := f(w.hctx)
		if err == nil {
			return nil, nil
		}
		switch orderErrorOf(err) {
		case orderConflict:
			w.log.Warn("idem: ordering conflict: another worker holds the key's head", "step", step, "err", err)
			return err, nil
		case orderFault:
			w.log.Error("idem: ordering store refused the step; not retrying it", "step", step, "err", err)
			return err, nil
		case orderFenced:
			w.log.Warn("idem: another claim of the partition came since this one's; leaving the partition to it", "step", step, "err", err)
			return err, errStopping
		}
		w.r.m.StoreErrors.WithLabelValues(w.r.cfg.Group).Inc()
		w.log.Warn("idem: ordering store unavailable; retrying", "step", step, "err", err, "try", n)
		if !sleep(w.stopCtx, w.r.wait.outage(n)) {
			return err, errStopping
		}
	}
}

// orderStep is orderTry for steps whose conflict or fault the caller takes
// as done (see orderError for what follows); errStopping means the partition
// is stopping.
func (w byKey) orderStep(f func(ctx context.Context) error) error {
	_, err := w.orderTry("block", f)
	return err
}

// park parks cm behind its key's head when the key is blocked by another
// message; parked=false means process it now (also when the store refused to
// park it: it is then processed unordered). An expired cm is only looked up
// (keyorder.Copy.Expired): parked is true when the store holds its message.
func (w byKey) park(cm *sarama.ConsumerMessage, msg *handler.Message, o origin, expired bool) (parked bool, err error) {
	if mutate.On(mutate.Park) {
		return false, nil
	}
	rec := keyorder.Record{
		Topic: o.topic, Key: cm.Key, IdempotencyKey: msg.IdempotencyKey,
		Partition: o.partition, Offset: o.offset, Timestamp: msg.Origin().Timestamp, Value: cm.Value,
	}
	for _, h := range cm.Headers {
		if h != nil {
			rec.Headers = append(rec.Headers, keyorder.Header{Key: string(h.Key), Value: h.Value})
		}
	}
	var st keyorder.State
	refused, err := w.orderTry("park", func(ctx context.Context) (err error) {
		st, err = w.r.order.ParkCopy(ctx, rec, keyorder.Copy{Topic: cm.Topic, Partition: cm.Partition, Offset: cm.Offset, FromTier: o.tier > 0, Expired: expired}, w.r.txn != nil)
		return err
	})
	if err != nil {
		return false, err
	}
	if refused != nil {
		w.log.Error("idem: cannot park; processing the message unordered", "offset", cm.Offset, "key", msg.IdempotencyKey)
		return false, nil
	}
	if st == keyorder.Blocked {
		w.log.Debug("idem: parked behind an earlier message of its key", "offset", cm.Offset, "key", msg.IdempotencyKey)
	}
	return st == keyorder.Blocked, nil
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

func (w byKey) hooks() *orderHooks {
	h, _ := w.hctx.Value(orderHooksKey{}).(*orderHooks)
	if h == nil {
		return &orderHooks{}
	}
	return h
}

// stuck logs a key a drain leaves blocked because the store refused a step.
func (w byKey) stuck(topic string, key []byte, head string) {
	w.log.Error("idem: key left blocked with its parked messages; release them with idem ordering release",
		"source", topic, "head", head,
		"release", fmt.Sprintf("idem ordering release --group %s --topic %s --key-hex %x --to source", w.r.cfg.Group, topic, key))
}

// ordering checks Config.Ordering.
func (c configCheck) ordering() {
	if c.Ordering.keyed && c.Ordering.db == nil {
		c.errs.Bad("Ordering", c.Ordering, "ByKey needs the PostgreSQL pool that holds the parked messages: ByKey(pool), not ByKey(nil)")
	}
}

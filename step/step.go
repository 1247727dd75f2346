package step

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/inboxconf"
	"github.com/idemhq/idem/internal/steptable"
)

// recordTimeout bounds the write of a step's row once fn has returned: it
// runs even when the handler's ctx has been cancelled meanwhile, because fn's
// effect happened and must not be forgotten.
const recordTimeout = 15 * time.Second

type scopeKey struct{}

// scope is what Do needs from a handler's ctx: where steps are recorded,
// and whose they are.
type scope struct {
	db    dedupe.DB
	group string
	key   string // the message's idempotency key; "" inside HandleBatch until WithMessage
}

// Bind returns a Middleware that lets the handler it wraps call Do and Key:
// it puts db (where the idem_steps table is: the pool of the service's
// dedupe.Postgres, as idem.Migrate made it) and group (the consumer group,
// Config.Group: steps are per group, as the inbox is) into each call's ctx,
// with the message's idempotency key. It keeps a batch handler a batch
// handler (handler.BatchHandler): in HandleBatch, give each message's ctx to
// Do with WithMessage.
//
// Do writes its rows on connections of db outside the handler's
// transaction, while that transaction holds a connection of its own: a pool
// shared with the dedupe store needs room for both (more connections than
// the consumer's lanes, Config.Concurrency), or use a second pool.
func Bind(db dedupe.DB, group string) handler.Middleware {
	return func(next handler.Handler) handler.Handler {
		b := bound{next: next, db: db, group: group}
		if bh, ok := next.(handler.BatchHandler); ok {
			return boundBatch{bound: b, batch: bh}
		}
		return b
	}
}

type bound struct {
	next  handler.Handler
	db    dedupe.DB
	group string
}

// Handle calls next with the step scope of m in ctx.
func (b bound) Handle(ctx context.Context, m *handler.Message) error {
	return b.next.Handle(context.WithValue(ctx, scopeKey{}, &scope{db: b.db, group: b.group, key: m.IdempotencyKey}), m)
}

type boundBatch struct {
	bound
	batch handler.BatchHandler
}

// HandleBatch calls the batch handler with the step scope, without a
// message, in ctx: WithMessage adds one.
func (b boundBatch) HandleBatch(ctx context.Context, msgs []*handler.Message) error {
	return b.batch.HandleBatch(context.WithValue(ctx, scopeKey{}, &scope{db: b.db, group: b.group}), msgs)
}

var (
	_ handler.Handler      = bound{}
	_ handler.BatchHandler = boundBatch{}
)

// WithMessage returns ctx with m as the message whose steps Do records: in a
// batch handler (Bind), call it for each message before its steps. Outside
// Bind's scope it returns ctx unchanged, and Do then fails.
func WithMessage(ctx context.Context, m *handler.Message) context.Context {
	sc, ok := ctx.Value(scopeKey{}).(*scope)
	if !ok {
		return ctx
	}
	return context.WithValue(ctx, scopeKey{}, &scope{db: sc.db, group: sc.group, key: m.IdempotencyKey})
}

// current returns the scope of ctx, or why there is none.
func current(ctx context.Context, name string) (*scope, error) {
	sc, ok := ctx.Value(scopeKey{}).(*scope)
	switch {
	case name == "":
		return nil, errors.New("step: the step's name is empty")
	case !ok || sc.db == nil:
		return nil, fmt.Errorf("step %q: ctx has no step scope: wrap the handler with step.Bind(db, group)", name)
	case sc.group == "":
		return nil, fmt.Errorf("step %q: step.Bind was given an empty group: give it the consumer group (Config.Group)", name)
	case sc.key == "":
		return nil, fmt.Errorf("step %q: no message in ctx: in a batch handler, pass step.WithMessage(ctx, m) to Do", name)
	}
	return sc, nil
}

// Do runs fn at most once per (idempotency key, step name) of the message
// being handled, as far as idem can see, and returns its result: the first
// call that gets a result records it, and every later call for the same
// message and name (an in-process retry, a redelivery after a crash or a
// rebalance, a replay from the dead-letter topic, another member) returns
// the recorded result without calling fn.
//
// The record is a row of idem_steps committed on its own connection (not in
// the handler's transaction) as soon as fn returns, so it survives the
// handler's transaction rolling back or the process dying before it
// commits. What the row cannot cover is a crash after fn's effect and
// before the row commits: then fn runs again. Make that second call
// harmless by passing Key(ctx, name) to the provider as its idempotency
// key: it is the same for every call of this step of this message.
//
// fn's outcomes:
//   - nil error: v is recorded (as JSON: T must survive encoding/json) and
//     returned;
//   - an error marked handler.Permanent (or handler.Decode): recorded as a
//     failure with its text, and returned; later calls return a Permanent
//     error with that text without calling fn;
//   - any other error: nothing is recorded and it is returned, so the
//     handler's retry calls fn again (with the same Key).
//
// The row is written even when ctx is cancelled after fn returned (within
// 15 s). Do needs the scope Bind puts in ctx (and, in a batch handler,
// WithMessage); without it, or with an empty name, it returns an error
// without calling fn. Steps of one message run one after another: Do is
// not meant to be called concurrently for one (message, name).
func Do[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	sc, err := current(ctx, name)
	if err != nil {
		return zero, err
	}
	id := steptable.ID{Group: sc.group, Key: sc.key, Step: name}
	if row, ok, err := steptable.Get(ctx, sc.db, id); err != nil {
		return zero, fmt.Errorf("step %q: read its record: %w", name, err)
	} else if ok {
		return recorded[T](name, row)
	}
	v, ferr := fn(ctx)
	if ferr != nil && !handler.IsPermanent(ferr) {
		return zero, ferr
	}
	row := steptable.Row{Done: ferr == nil}
	if ferr != nil {
		row.Error = ferr.Error()
	} else if row.Result, err = json.Marshal(v); err != nil {
		return zero, fmt.Errorf("step %q: its result cannot be recorded as JSON: %w", name, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	got, err := steptable.Record(rctx, sc.db, id, row)
	if err != nil {
		return zero, fmt.Errorf("step %q: its effect happened but could not be recorded (a retry calls it again with the same step.Key): %w", name, err)
	}
	if ferr != nil && !got.Done && got.Error == row.Error {
		return zero, ferr // this call's own failure: returned as fn gave it
	}
	return recorded[T](name, got)
}

// recorded returns what row says a step returned.
func recorded[T any](name string, row steptable.Row) (T, error) {
	var v T
	if !row.Done {
		return v, handler.Permanent(fmt.Errorf("step %q failed permanently before: %s", name, row.Error))
	}
	if err := json.Unmarshal(row.Result, &v); err != nil {
		return v, fmt.Errorf("step %q: its recorded result does not decode into %T: %w", name, v, err)
	}
	return v, nil
}

// Key returns the idempotency key of step name of the message being
// handled, for the provider the step calls: the same for every call of
// that step of that message, in every member and after every restart, and
// different for every other (group, message, step). It is "idem-" and 40
// hex digits (160 bits of SHA-256 over the group, the message's idempotency
// key and name), short enough for providers' limits (Stripe's is 255).
// Outside Bind's scope (or with no message in a batch handler) it returns
// "".
func Key(ctx context.Context, name string) string {
	sc, err := current(ctx, name)
	if err != nil {
		return ""
	}
	h := sha256.New()
	for _, part := range []string{sc.group, sc.key, name} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return "idem-" + hex.EncodeToString(h.Sum(nil)[:20])
}

// sweepBatch is how many rows one DELETE of Sweep removes.
const sweepBatch = 1000

// Sweep deletes the steps recorded more than olderThan ago and returns how
// many it deleted. Give it the inbox's retention (consumer.Config.Retention.Keep,
// 14 days by default): a step must be kept as long as its message's key,
// since a copy of the message that arrives after its key is gone runs its
// handler, and its steps, again anyway. Run it from a goroutine you own,
// every few minutes, or a cron job; several at once are safe (rows one
// locks are skipped by the others). olderThan below 1h is an error.
func Sweep(ctx context.Context, db dedupe.DB, olderThan time.Duration) (int64, error) {
	if olderThan < inboxconf.MinRetention {
		return 0, fmt.Errorf("step: Sweep olderThan = %s: must be at least %s, and the inbox's retention", olderThan, inboxconf.MinRetention)
	}
	var horizon time.Time
	if err := db.QueryRow(ctx, "SELECT now() - $1::bigint * interval '1 microsecond'", olderThan.Microseconds()).Scan(&horizon); err != nil {
		return 0, fmt.Errorf("step: sweep: read horizon: %w", err)
	}
	return steptable.Sweep(ctx, db, horizon, sweepBatch)
}

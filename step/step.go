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
	"github.com/idemhq/idem/internal/tables"
)

// recordTimeout bounds the write of a step's row once fn has returned: it
// runs even when the handler's ctx has been cancelled meanwhile, because fn's
// effect happened and must not be forgotten.
const recordTimeout = 15 * time.Second

// For returns ctx naming m as the message whose steps Do records and Key
// derives. A handler consumer.Run calls for one message gets a ctx that
// names it already; a batch handler (handler.Batch, handler.TypedBatch)
// gets the batch's ctx, and passes For(ctx, m) to Do for each message:
//
//	for _, m := range msgs {
//		if _, err := step.Do(step.For(ctx, m), "notify", notify(m)); err != nil {
//			return err
//		}
//	}
//
// Outside a handler consumer.Run calls, For returns ctx unchanged and Do
// then fails.
func For(ctx context.Context, m *handler.Message) context.Context {
	sc := tables.StepScopeOf(ctx)
	if sc == nil || m == nil {
		return ctx
	}
	return tables.WithStepScope(ctx, &tables.StepScope{DB: sc.DB, Group: sc.Group, Key: m.IdempotencyKey})
}

// current returns the scope of ctx, or why there is none.
func current(ctx context.Context, name string) (*tables.StepScope, error) {
	sc := tables.StepScopeOf(ctx)
	switch {
	case name == "":
		return nil, errors.New("step: the step's name is empty")
	case sc == nil:
		return nil, fmt.Errorf("step %q: ctx is not a handler's ctx of consumer.Run (nor derived from one)", name)
	case sc.DB == nil:
		return nil, fmt.Errorf("step %q: the consumer's dedupe store has no database (dedupe.NewMemory): steps are recorded in the idem_steps table of a PostgreSQL store's database", name)
	case sc.Key == "":
		return nil, fmt.Errorf("step %q: ctx names no message: in a batch handler, pass step.For(ctx, m) to Do", name)
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
// 15 s). Do needs a handler's ctx of consumer.Run with a PostgreSQL dedupe
// store (in a batch handler, For(ctx, m)); without it, or with an empty
// name, it returns an error without calling fn. Steps of one message run one after another: Do is
// not meant to be called concurrently for one (message, name).
func Do[T any](ctx context.Context, name string, fn func(ctx context.Context) (T, error)) (T, error) {
	var zero T
	sc, err := current(ctx, name)
	if err != nil {
		return zero, err
	}
	id := tables.StepID{Group: sc.Group, Key: sc.Key, Step: name}
	var read dedupe.DB = sc.DB
	if dedupe.HasTx(ctx) {
		read = dedupe.Tx(ctx) // no second connection while the handler holds one
	}
	if row, ok, err := tables.GetStep(ctx, read, id); err != nil {
		return zero, fmt.Errorf("step %q: read its record: %w", name, err)
	} else if ok {
		return recorded[T](name, row)
	}
	v, ferr := fn(ctx)
	if ferr != nil && !handler.IsPermanent(ferr) {
		return zero, ferr
	}
	row := tables.StepRow{Done: ferr == nil}
	if ferr != nil {
		row.Error = ferr.Error()
	} else if row.Result, err = json.Marshal(v); err != nil {
		return zero, fmt.Errorf("step %q: its result cannot be recorded as JSON: %w", name, err)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	got, err := tables.RecordStep(rctx, sc.DB, id, row)
	if err != nil {
		return zero, fmt.Errorf("step %q: its effect happened but could not be recorded (a retry calls it again with the same step.Key): %w", name, err)
	}
	if ferr != nil && !got.Done && got.Error == row.Error {
		return zero, ferr // this call's own failure: returned as fn gave it
	}
	return recorded[T](name, got)
}

// recorded returns what row says a step returned.
func recorded[T any](name string, row tables.StepRow) (T, error) {
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
// Outside a handler's ctx (or with no message named in a batch handler: For)
// it returns "".
func Key(ctx context.Context, name string) string {
	sc := tables.StepScopeOf(ctx)
	if sc == nil || sc.Key == "" || name == "" {
		return ""
	}
	h := sha256.New()
	for _, part := range []string{sc.Group, sc.Key, name} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return "idem-" + hex.EncodeToString(h.Sum(nil)[:20])
}

package handler

import (
	"context"
	"errors"
)

// Typed returns a Handler that decodes each message's value with decode and
// calls fn with the decoded value and the message (for its headers, key and
// Origin). It is an ordinary Handler: give it to consumer.Run, wrap it in
// middleware, as any other.
//
// decode is typically a codec's method value, such as the Decode method of
// a serde.Codec (Avro, Protobuf, JSON Schema in a schema registry's wire
// format). Its error is returned as it is, without calling fn, so its class
// decides what happens to the message: a value that cannot be decoded must
// be marked Decode (dead-lettered at once, its bytes kept unchanged); an
// unreachable schema registry should wrap a *breaker.OpenError (serde's
// *UnavailableError does), which makes the consumer wait without spending
// an attempt; any other error is retried like a handler's.
//
// fn has Handler's contract; v is its own, m is idem's and must not be used
// after fn returns. Typed(nil, …) or Typed(…, nil) returns nil.
func Typed[T any](decode func(ctx context.Context, m *Message) (T, error), fn func(ctx context.Context, v T, m *Message) error) Handler {
	if decode == nil || fn == nil {
		return nil
	}
	return Func(func(ctx context.Context, m *Message) error {
		v, err := decode(ctx, m)
		if err != nil {
			return err
		}
		return fn(ctx, v, m)
	})
}

// TypedBatch returns a batch Handler (see Batch) that decodes each message of
// a batch with decode and calls fn with the decoded values and their
// messages: vs[i] is the value of msgs[i], in offset order.
//
// A message whose value cannot be decoded (an error marked Decode) is left
// out of vs and msgs and fails alone: TypedBatch reports it in a *BatchError,
// so it is dead-lettered while the rest of the batch commits, and fn is not
// called when no message decodes. If fn itself returns a *BatchError, the
// decode failures are added to it; any other error of fn fails the whole
// batch, as Batch describes. Any other decode error (the registry
// unavailable, ctx done) fails the whole batch at once, without calling fn:
// each message then runs alone and meets the same error on its own.
//
// TypedBatch(nil, …) or TypedBatch(…, nil) returns nil.
func TypedBatch[T any](decode func(ctx context.Context, m *Message) (T, error), fn func(ctx context.Context, vs []T, msgs []*Message) error) Handler {
	if decode == nil || fn == nil {
		return nil
	}
	return Batch(func(ctx context.Context, msgs []*Message) error {
		vs := make([]T, 0, len(msgs))
		ok := make([]*Message, 0, len(msgs))
		var failed BatchError
		for _, m := range msgs {
			v, err := decode(ctx, m)
			switch {
			case err == nil:
				vs, ok = append(vs, v), append(ok, m)
			case IsDecode(err):
				failed.Add(m, err)
			default:
				return err
			}
		}
		if len(ok) == 0 {
			return &failed
		}
		err := fn(ctx, vs, ok)
		var be *BatchError
		switch {
		case err == nil && len(failed.Failed) == 0:
			return nil
		case err == nil:
			return &failed
		case errors.As(err, &be) && len(failed.Failed) > 0:
			return &BatchError{Failed: append(append([]MessageError(nil), be.Failed...), failed.Failed...)}
		}
		return err
	})
}

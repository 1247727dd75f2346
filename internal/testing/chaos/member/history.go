package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/chaos/memberkit"
)

// This file is the member's hooks: a history of every handler call, an
// effects ledger written in the message's transaction, and injected
// transient failures.

// Attempt is one line of a member's history file: one call of the handler
// for one message, and what the handler returned. "ok" only means the
// handler returned nil: whether its transaction committed is what the
// chaos_effects table (and the payments table) say.
type Attempt struct {
	Member    string    `json:"member"`            // the -member name
	Mode      string    `json:"mode"`              // the -mode
	Topic     string    `json:"topic"`             // where the record was read (a retry tier too)
	Partition int32     `json:"partition"`         //
	Offset    int64     `json:"offset"`            //
	Key       string    `json:"key"`               // idempotency key
	KafkaKey  string    `json:"kafka_key"`         // record key
	Seq       int64     `json:"seq"`               // the producer's chaos-seq header, -1 when absent
	Attempt   int       `json:"attempt"`           // handler.Message.Attempt
	Batch     int       `json:"batch"`             // messages in the handler call (1 outside batch handlers)
	Outcome   string    `json:"outcome"`           // "ok" or the handler.ErrorKind of the error
	Error     string    `json:"error,omitempty"`   // the handler's error text
	Start     time.Time `json:"start"`             // handler call began
	End       time.Time `json:"end"`               // handler call returned
	Injected  bool      `json:"injected,omitzero"` // the failure was injected by -fail-header
}

// recorder wraps the payment handlers with the chaos hooks.
type recorder struct {
	member, mode string
	failHeader   string // header whose integer value N fails a message's first N attempts
	log          *memberkit.HistoryLog
}

// attempt builds the history line of m.
func (r *recorder) attempt(m *handler.Message, batch int, start time.Time, err error, injected bool) Attempt {
	a := Attempt{
		Member: r.member, Mode: r.mode, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
		Key: m.IdempotencyKey, KafkaKey: string(m.Key), Seq: memberkit.Seq(m), Attempt: m.Attempt, Batch: batch,
		Outcome: outcomeOf(err), Start: start, End: time.Now(), Injected: injected,
	}
	if err != nil {
		a.Error = err.Error()
	}
	return a
}

// outcomeOf names a handler result the way the checker reads it.
func outcomeOf(err error) string {
	if err == nil {
		return "ok"
	}
	return string(handler.ErrorKind(err))
}

// injectedFailure returns a retriable error while m's attempt is within the
// count its fail header asks for.
func (r *recorder) injectedFailure(m *handler.Message) error {
	if r.failHeader == "" {
		return nil
	}
	v, ok := m.Header(r.failHeader)
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(string(v))
	if err != nil || m.Attempt > n {
		return nil
	}
	return fmt.Errorf("injected failure %d of %d (%s header)", m.Attempt, n, r.failHeader)
}

// effect writes m's ledger row in the transaction of ctx.
func (r *recorder) effect(ctx context.Context, m *handler.Message) error {
	return memberkit.Effect(ctx, r.member, m)
}

// wrap returns h with the hooks: injected failures first, then h, then the
// ledger row, and one history line per call.
func (r *recorder) wrap(h handler.Handler) handler.Handler {
	return handler.Func(func(ctx context.Context, m *handler.Message) error {
		start := time.Now()
		err := r.injectedFailure(m)
		injected := err != nil
		if err == nil {
			err = h.Handle(ctx, m)
		}
		if err == nil {
			err = r.effect(ctx, m)
		}
		r.log.Add(r.attempt(m, 1, start, err, injected))
		return err
	})
}

// wrapBatch is wrap for a batch handler: injected failures are reported in a
// *handler.BatchError without calling h for those messages.
func (r *recorder) wrapBatch(h handler.BatchHandler) handler.Handler {
	return handler.Batch(func(ctx context.Context, msgs []*handler.Message) error {
		start := time.Now()
		injected := map[*handler.Message]error{}
		rest := make([]*handler.Message, 0, len(msgs))
		for _, m := range msgs {
			if err := r.injectedFailure(m); err != nil {
				injected[m] = err
				continue
			}
			rest = append(rest, m)
		}
		var err error
		if len(rest) > 0 {
			err = h.HandleBatch(ctx, rest)
		}
		failed := map[*handler.Message]error{}
		var be *handler.BatchError
		if errors.As(err, &be) {
			for _, f := range be.Failed {
				failed[f.Message] = f.Err
			}
			err = nil
		}
		if err == nil && len(failed) == 0 && len(injected) == 0 {
			for _, m := range rest {
				if err = r.effect(ctx, m); err != nil {
					break
				}
			}
		}
		for _, m := range msgs {
			merr, inj := injected[m]
			switch {
			case inj:
			case failed[m] != nil:
				merr = failed[m]
			default:
				merr = err
			}
			r.log.Add(r.attempt(m, len(msgs), start, merr, inj))
		}
		if err != nil {
			return err
		}
		if len(failed)+len(injected) > 0 {
			be := &handler.BatchError{}
			for _, m := range msgs {
				if e, ok := injected[m]; ok {
					be.Add(m, e)
				} else if e := failed[m]; e != nil {
					be.Add(m, e)
				}
			}
			return be
		}
		return nil
	})
}

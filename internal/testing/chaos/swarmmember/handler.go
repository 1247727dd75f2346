package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testing/chaos/check"
	"github.com/idemhq/idem/internal/testing/chaos/draw"
	"github.com/idemhq/idem/internal/testing/chaos/memberkit"
	"github.com/idemhq/idem/outbox"
)

// The headers the workload (internal/testing/chaos, planSwarm) sets to tell the
// handler what to do with a record.
const (
	hdrFail   = "chaos-fail"        // N: the first N attempts fail with a retriable error no rule matches
	hdrLadder = "chaos-fail-ladder" // N: the first N attempts fail with errLadder (the "ladder" rule)
	hdrFraud  = "chaos-fraud"       // every attempt fails with errFraud (the "fraud" rule: its own DLQ)
	hdrDefer  = "chaos-defer"       // ms: read from the source topic, the handler defers it this long
	hdrDep    = "chaos-dep"         // A or B: the handler calls that dependency through the breaker set
	hdrSlow   = "chaos-slow"        // ms: the handler takes this long
)

// The errors the rules match.
var (
	errLadder  = errors.New("swarm: a failure of the ladder rule's kind")
	errFraud   = errors.New("swarm: fraud suspected")
	errHook    = errors.New("swarm: the hook's dependency is down (a failing window)")
	errDepDown = errors.New("swarm: dependency A answered 503")
	errDep429  = errors.New("swarm: dependency B answered 429 Too Many Requests")
)

// inFlight counts the handler calls running, for the adaptive limit's
// invariant.
type inFlight struct{ n atomic.Int64 }

func (f *inFlight) enter() (now int, leave func()) {
	return int(f.n.Add(1)), func() { f.n.Add(-1) }
}

// handle is the per-message handler.
func (s *service) handle(ctx context.Context, m *handler.Message) error {
	n, leave := s.inFlight.enter()
	defer leave()
	start := time.Now()
	err := s.logic(ctx, m)
	if err == nil {
		err = s.effect(ctx, m)
	}
	s.record(m, 1, n, start, err)
	return err
}

// handleBatch is the handler.Batch form: each message as handle does it, in
// the batch's transaction; the failed ones named in a *handler.BatchError.
func (s *service) handleBatch(ctx context.Context, msgs []*handler.Message) error {
	n, leave := s.inFlight.enter()
	defer leave()
	start := time.Now()
	be := &handler.BatchError{}
	for i, m := range msgs {
		err := s.logic(ctx, m)
		if err != nil {
			be.Add(m, err)
			s.record(m, len(msgs), n, start, err)
			continue
		}
		if err := s.effect(ctx, m); err != nil {
			for _, rest := range msgs[i:] {
				s.record(rest, len(msgs), n, start, err)
			}
			return err // the whole batch rolls back and runs again message by message
		}
		s.record(m, len(msgs), n, start, nil)
	}
	if len(be.Failed) > 0 {
		return be
	}
	return nil
}

// logic is what a record's headers ask of the handler, before its effect.
func (s *service) logic(ctx context.Context, m *handler.Message) error {
	if m.Value == nil {
		return handler.Decode(errors.New("a null value"))
	}
	if !utf8.Valid(m.Value) {
		return handler.Permanent(errors.New("the value is not UTF-8"))
	}
	var body struct {
		V string `json:"v"`
	}
	if err := json.Unmarshal(m.Value, &body); err != nil {
		return handler.Decode(err)
	}
	if body.V == "reject" {
		return handler.Permanent(errors.New("the handler refuses this record"))
	}
	if body.V == "panic" { // a bug in the handler: Run recovers it (handler.Recover) and dead-letters the message
		panic("swarm: the handler hit a bug on this record")
	}
	if ms, ok := intHeader(m, hdrDefer); ok && m.Topic == s.m.Topic {
		return handler.DeferUntil(time.Now().Add(time.Duration(ms) * time.Millisecond))
	}
	if dep, ok := m.Header(hdrDep); ok && s.deps != nil {
		if err := s.deps.Do(ctx, string(dep), s.call(string(dep))); err != nil {
			return err
		}
	}
	if n, ok := intHeader(m, hdrFail); ok && m.Attempt <= n {
		return fmt.Errorf("swarm: injected failure %d of %d", m.Attempt, n)
	}
	if n, ok := intHeader(m, hdrLadder); ok && m.Attempt <= n {
		return fmt.Errorf("%w (%d of %d)", errLadder, m.Attempt, n)
	}
	if _, ok := m.Header(hdrFraud); ok {
		return errFraud
	}
	if ms, ok := intHeader(m, hdrSlow); ok {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// call is dependency dep's answer now: A is down in its windows, B answers
// 429 with a Retry-After in its.
func (s *service) call(dep string) func(context.Context) error {
	return func(context.Context) error {
		at := s.m.Since(time.Now())
		switch {
		case dep == "A" && s.m.Breaker != nil && draw.InAny(s.m.Breaker.Down, at):
			return errDepDown
		case dep == "B" && draw.InAny(s.m.Throttle, at):
			return handler.RetryAfter(errDep429, s.m.RetryAfter.D())
		}
		return nil
	}
}

// effect writes m's ledger row and, with Outbox, its event, in m's
// transaction.
func (s *service) effect(ctx context.Context, m *handler.Message) error {
	if err := memberkit.Effect(ctx, s.member, m); err != nil {
		return err
	}
	if !s.m.Outbox {
		return nil
	}
	v, _ := json.Marshal(map[string]string{"idempotency_key": m.IdempotencyKey})
	if err := outbox.Enqueue(ctx, dedupe.Tx(ctx), outbox.Message{Topic: s.m.Events, Key: m.Key, Value: v}); err != nil {
		return fmt.Errorf("enqueue the event of %s: %w", m.IdempotencyKey, err)
	}
	return nil
}

// record writes one history line: m's call, in a handler call of batch
// messages begun at start with inFlight calls running.
func (s *service) record(m *handler.Message, batch, inFlight int, start time.Time, err error) {
	o := m.Origin()
	a := check.Attempt{Member: s.member, Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.IdempotencyKey,
		Seq: memberkit.Seq(m), Attempt: m.Attempt, Batch: batch, Outcome: "ok", Start: start, End: time.Now(), InFlight: inFlight,
		Origin: &check.Origin{Topic: o.Topic, Partition: o.Partition, Offset: o.Offset, Timestamp: o.Timestamp}}
	if err != nil {
		a.Outcome, a.Error = string(handler.ErrorKind(err)), err.Error()
	}
	s.hist.Add(a)
}

// onDeadLettered is Config.OnDeadLettered: a ledger row in the hook's
// transaction, or an error in a failing window.
func (s *service) onDeadLettered(ctx context.Context, d consumer.DeadLettered) error {
	return s.hookRow(ctx, "dead-lettered", d.Message, d.Topic, string(d.Kind))
}

// onExpired is Config.Expiry.OnExpired, as onDeadLettered.
func (s *service) onExpired(ctx context.Context, x consumer.Expired) error {
	return s.hookRow(ctx, "expired", x.Message, "", x.Reason)
}

func (s *service) hookRow(ctx context.Context, hook string, m *handler.Message, topic, kind string) error {
	if draw.InAny(s.m.HookFail, s.m.Since(time.Now())) {
		return errHook
	}
	if !dedupe.HasTx(ctx) {
		return memberkit.ErrNoTx
	}
	o := m.Origin()
	_, err := dedupe.Tx(ctx).Exec(ctx, `INSERT INTO chaos_hooks (hook, seq, idempotency_key, topic, member, origin_topic, origin_partition, origin_offset, kind)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		hook, memberkit.Seq(m), m.IdempotencyKey, topic, s.member, o.Topic, o.Partition, o.Offset, kind)
	return err
}

// intHeader is header name of m as an integer.
func intHeader(m *handler.Message, name string) (int, bool) {
	v, ok := m.Header(name)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(string(v))
	return n, err == nil
}

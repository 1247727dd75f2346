// Package correlation is the correlation id a context carries: the id that
// ties together every message and step one business request causes, across
// services. consumer.Run puts the id of the message being handled into the
// handler's ctx (its header Header, or else its idempotency key); package
// outbox reads it when it enqueues an event (and exports WithCorrelationID
// and CorrelationID), package saga stores it with a saga and gives it to
// every step and compensation; it is published as the header Header.
package correlation

import (
	"context"
	"sync/atomic"

	"github.com/idemhq/idem/handler"
)

// Header is the record header that carries the correlation id.
const Header = "idem-correlation-id"

// key is the context key of the id: a string (With), a *Slot (WithSlot) or
// a *handler.Message (ForMessage). The innermost wins.
type key struct{}

// With returns a copy of ctx carrying id; an empty id leaves ctx as it is.
func With(ctx context.Context, id string) context.Context {
	if id == "" {
		return ctx
	}
	return context.WithValue(ctx, key{}, id)
}

// From returns the correlation id ctx carries, "" when none.
func From(ctx context.Context) string {
	switch v := ctx.Value(key{}).(type) {
	case string:
		return v
	case *Slot:
		return Of(v.m.Load())
	case *handler.Message:
		return Of(v)
	}
	return ""
}

// Of is the correlation id of a consumed message: its Header, or, for a
// message without one (the first of a chain), its idempotency key, the
// same for every delivery of the message. "" for nil.
func Of(m *handler.Message) string {
	if m == nil {
		return ""
	}
	if v, ok := m.Header(Header); ok && len(v) > 0 {
		return string(v)
	}
	return m.IdempotencyKey
}

// ForMessage returns a copy of ctx whose correlation id is m's (Of),
// read when asked for.
func ForMessage(ctx context.Context, m *handler.Message) context.Context {
	return context.WithValue(ctx, key{}, m)
}

// Slot is where a consumer's worker puts the message it is handling, so
// that the handler's ctx carries that message's correlation id without a
// context made per message (the no-op path allocates nothing for it). A
// worker makes one (WithSlot) into the ctx its handler calls derive from,
// sets the message before each call and clears it after. A ctx kept past
// the call has no correlation id then. It is safe for concurrent use.
type Slot struct {
	m atomic.Pointer[handler.Message]
}

// WithSlot returns a copy of ctx with a new, empty Slot.
func WithSlot(ctx context.Context) context.Context {
	return context.WithValue(ctx, key{}, &Slot{})
}

// SlotOf returns the Slot whose id ctx carries, nil when its id (if any)
// comes from elsewhere.
func SlotOf(ctx context.Context) *Slot {
	s, _ := ctx.Value(key{}).(*Slot)
	return s
}

// Set makes m (nil: none) the message whose correlation id the slot's
// contexts carry.
func (s *Slot) Set(m *handler.Message) { s.m.Store(m) }

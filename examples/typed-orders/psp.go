package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
)

// PSP is the example's payment service provider, in process: like a real
// one (Stripe, Adyen) it honours idempotency keys: a second request with a
// key it has seen returns the first charge and charges nothing.
type PSP struct {
	mu       sync.Mutex
	charges  map[string]string // idempotency key → charge id
	requests int
}

func newPSP() *PSP { return &PSP{charges: map[string]string{}} }

// Charge charges cents once per idempotency key and returns the charge's id.
func (p *PSP) Charge(_ context.Context, idempotencyKey string, cents int64, currency string) (string, error) {
	if idempotencyKey == "" {
		return "", errors.New("psp: an idempotency key is required")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.requests++
	if id, ok := p.charges[idempotencyKey]; ok {
		return id, nil
	}
	sum := sha256.Sum256([]byte(idempotencyKey))
	id := "ch_" + hex.EncodeToString(sum[:8])
	p.charges[idempotencyKey] = id
	return id, nil
}

// Figures returns how many requests the PSP got and how many charges it
// made.
func (p *PSP) Figures() (requests, charges int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests, len(p.charges)
}

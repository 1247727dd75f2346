package recovery

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff shapes the in-process waits between a message's handler attempts:
// retry n (n >= 1) waits a uniformly random time in
// [0, min(Max, Base*2^(n-1))], the "full jitter" of AWS's "Exponential Backoff
// and Jitter" (seed §4: many failing consumers must not retry in lockstep).
// It is the consumer's backoff (Config.Retry.Backoff), as a
// value a rule can choose. It is not github.com/cenkalti/backoff, whose
// randomization factor spreads waits around the mean ("equal jitter"), not
// over the whole window, and which keeps state per sequence.
//
// In a Rule, a zero field takes the value of the Fallback's Backoff.
type Backoff struct {
	// Base is the first retry's window. Must be >= 0; 0 in a Rule: the
	// Fallback's.
	Base time.Duration
	// Max caps the window. Must be >= Base; 0 in a Rule: the Fallback's.
	Max time.Duration
}

// Delay returns the wait before retry n (n >= 1), drawn from r. It is 0 when
// n < 1 or Base <= 0.
func (b Backoff) Delay(n int, r *rand.Rand) time.Duration {
	if b.Base <= 0 || n < 1 {
		return 0
	}
	ceil := b.Max
	if n-1 < 63 && b.Base <= b.Max>>(n-1) {
		ceil = b.Base << (n - 1)
	}
	return time.Duration(r.Uint64N(uint64(ceil) + 1))
}

// check reports what is wrong with b once defaults are applied.
func (b Backoff) check() error {
	switch {
	case b.Base < 0:
		return fmt.Errorf("Backoff.Base = %s, must be >= 0", b.Base)
	case b.Max < b.Base:
		return fmt.Errorf("Backoff.Max = %s, must be >= Backoff.Base (%s)", b.Max, b.Base)
	}
	return nil
}

// or returns b with its zero fields taken from d.
func (b Backoff) or(d Backoff) Backoff {
	if b.Base == 0 {
		b.Base = d.Base
	}
	if b.Max == 0 {
		b.Max = d.Max
	}
	return b
}

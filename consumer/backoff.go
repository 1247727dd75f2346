package consumer

import (
	"context"
	"math/rand/v2"
	"time"
)

// fullJitter returns the delay before retry n (n >= 1): a uniformly random
// duration in [0, min(cap, base*2^(n-1))], the "full jitter" of AWS's
// "Exponential Backoff and Jitter". Spreading retries over the whole window
// keeps many failing consumers from retrying in lockstep (seed §4). We keep this
// six-line function rather than cenkalti/backoff, whose randomization factor
// gives "equal jitter" around the mean, not full jitter.
func fullJitter(base, max time.Duration, n int, r *rand.Rand) time.Duration {
	if base <= 0 || n < 1 {
		return 0
	}
	ceil := max
	if n-1 < 63 && base <= max>>(n-1) {
		ceil = base << (n - 1)
	}
	return time.Duration(r.Uint64N(uint64(ceil) + 1))
}

// sleep waits for d or until ctx is done; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 || ctx.Err() != nil {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

package consumer

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"
)

// delays draws the randomized waits of one Run: between in-process retries
// of a failing message (backoff, with its route's Retry.Backoff or its
// rule's), and between tries while a dependency is out.
type delays struct {
	outageMax time.Duration

	mu   sync.Mutex
	rand *rand.Rand
}

func newDelays(cfg Config) *delays {
	return &delays{outageMax: cfg.OutageBackoff,
		rand: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// outage is the wait before try n during an outage: full jitter from 100 ms
// up to OutageBackoff, at least 50 ms.
func (d *delays) outage(n int) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return max(fullJitter(100*time.Millisecond, d.outageMax, n, d.rand), 50*time.Millisecond)
}

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

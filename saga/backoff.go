package saga

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff is the wait before attempt n+1 after n failures (n >= 1): full
// jitter, a uniform random duration in [0, min(max, base·2^(n-1))], as the
// consumer's in-process retries use (seed §4: backoff with jitter).
func (o *Orchestrator) backoff(n int) time.Duration {
	ceil := ceiling(o.cfg.BackoffBase, o.cfg.BackoffMax, n)
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil + 1)
}

// ceiling is min(limit, base·2^(n-1)), without overflow.
func ceiling(base, limit time.Duration, n int) time.Duration {
	if n-1 < 62 && base <= limit>>(n-1) {
		return base << (n - 1)
	}
	return limit
}

// compensationBackoff is the wait after the n-th failed call (n >= 1) of a
// step's compensation: exponential with equal jitter, a uniform random
// duration in [c/2, c], c = min(CompensationBackoffMax, BackoffBase·2^(n-1)),
// so the waits grow with n (see Config.CompensationBackoffMax).
func (o *Orchestrator) compensationBackoff(n int) time.Duration {
	ceil := ceiling(o.cfg.BackoffBase, o.cfg.CompensationBackoffMax, n)
	if ceil <= 0 {
		return 0
	}
	return ceil/2 + rand.N(ceil-ceil/2+1)
}

// wait sleeps for d unless ctx ends first; it returns ctx's error then.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

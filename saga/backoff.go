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
	ceil := o.cfg.BackoffMax
	if n-1 < 62 && o.cfg.BackoffBase <= ceil>>(n-1) {
		ceil = o.cfg.BackoffBase << (n - 1)
	}
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil + 1)
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

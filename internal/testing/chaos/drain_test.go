package chaos

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestDrainLoopWaitsForProgress: a drain that keeps making progress is not
// cut at its stall timeout (a long serial chain: one hot key through every
// tier, which a swarm seed reported as lag), one that stops making progress
// fails after it, and a drain longer than its cap fails too.
func TestDrainLoopWaitsForProgress(t *testing.T) {
	ctx := context.Background()
	const tick, stall = time.Millisecond, time.Second // generous: a loaded machine may sleep far past a tick
	// slow takes one step every step (a third of the stall timeout): in all
	// well past the stall timeout, never that long without progress.
	slow := func(steps int, step time.Duration) func() (int64, int64, error) {
		left, last := int64(steps), time.Now()
		return func() (int64, int64, error) {
			if time.Since(last) >= step && left > 0 {
				left, last = left-1, time.Now()
			}
			return left, int64(steps) - left, nil
		}
	}
	if err := drainLoop(ctx, slow(6, stall/3), stall, time.Minute, tick); err != nil {
		t.Errorf("a drain that keeps making progress past its stall timeout: %v", err)
	}
	stuck := func() (int64, int64, error) { return 5, 0, nil }
	if err := drainLoop(ctx, stuck, stall, time.Minute, tick); err == nil || !strings.Contains(err.Error(), "no progress") {
		t.Errorf("a stuck drain: %v, want no progress", err)
	}
	if err := drainLoop(ctx, slow(1000, time.Millisecond), stall, 50*time.Millisecond, tick); err == nil || !strings.Contains(err.Error(), "not drained after") {
		t.Errorf("a drain past its cap: %v", err)
	}
	// Records forwarded to a tier add to what is left for a while: the group
	// committing further is progress too.
	tierHop := func() func() (int64, int64, error) {
		n := 0
		return func() (int64, int64, error) {
			n++
			switch {
			case n < 200:
				return 10, int64(n / 10), nil // committing, while the tiers keep 10 left
			default:
				return 0, 100, nil
			}
		}
	}
	if err := drainLoop(ctx, tierHop(), stall, time.Minute, tick); err != nil {
		t.Errorf("a drain whose committed offsets grow while its lag stays: %v", err)
	}
}

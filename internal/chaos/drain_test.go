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
	const tick, stall = time.Millisecond, 30 * time.Millisecond
	slow := func(steps int) func() (int64, int64, error) {
		left, n := int64(steps), 0
		return func() (int64, int64, error) {
			if n++; n%10 == 0 && left > 0 { // one step every 10 ticks: well within the stall timeout
				left--
			}
			return left, int64(steps) - left, nil
		}
	}
	if err := drainLoop(ctx, slow(12), stall, time.Minute, tick); err != nil {
		t.Errorf("a drain that keeps making progress past its stall timeout: %v", err)
	}
	stuck := func() (int64, int64, error) { return 5, 0, nil }
	if err := drainLoop(ctx, stuck, stall, time.Minute, tick); err == nil || !strings.Contains(err.Error(), "no progress") {
		t.Errorf("a stuck drain: %v, want no progress", err)
	}
	if err := drainLoop(ctx, slow(1000), stall, 50*time.Millisecond, tick); err == nil || !strings.Contains(err.Error(), "not drained after") {
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

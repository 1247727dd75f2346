package consumer_test

import (
	"context"
	"testing"

	"github.com/idemhq/idem/consumer"
)

// TestRunCancelledWhileStartingReturnsNil: a Run whose ctx is cancelled
// before it has set up its retry topics and ordering schema (a SIGTERM right
// after a process starts, as the chaos run sends) is a shutdown, not a fatal
// error: Run returns nil, as it does when cancelled later.
func TestRunCancelledWhileStartingReturnsNil(t *testing.T) {
	for _, ordering := range []bool{false, true} {
		e := newEnv(t, 2)
		cfg := e.config()
		if ordering {
			cfg.Ordering = consumer.ByKey(e.pool)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := consumer.Run(ctx, cfg, effectHandler()); err != nil {
			t.Fatalf("ordering %v: Run cancelled at start returned %v, want nil", ordering, err)
		}
	}
}

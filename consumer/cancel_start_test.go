package consumer_test

import (
	"context"
	"testing"

	"github.com/idemhq/idem/consumer"
)

// TestRunCancelledWhileStartingReturnsNil: a Run whose ctx is cancelled
// before it has set up its retry topics (a SIGTERM right after a process
// starts, as the chaos run sends) is a shutdown, not a fatal error: Run
// returns nil, as it does when cancelled later.
func TestRunCancelledWhileStartingReturnsNil(t *testing.T) {
	e := newEnv(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := consumer.Run(ctx, e.config(), effectHandler()); err != nil {
		t.Fatalf("Run cancelled at start returned %v, want nil", err)
	}
}

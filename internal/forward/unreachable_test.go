package forward

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"

	"github.com/IBM/sarama"
)

// IsUnreachable says which admin errors are worth sending again: a broker
// that did not answer, not a cluster that refused.
func TestIsUnreachable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{refused, true},
		{fmt.Errorf("retrytopic: describe topic t: %w", refused), true},
		{errors.Join(refused, errors.New("list topics: no available broker")), true},
		{sarama.ErrNotController, true},
		{sarama.ErrRequestTimedOut, true},
		// InitProducerId while a restarted node loads __transaction_state
		// (a chaos run's rolling restart, after sarama's own 5 s of retries).
		{fmt.Errorf("txn: transactional producer %q: %w", "idem-g-x", sarama.ErrOffsetsLoadInProgress), true},
		{sarama.ErrConsumerCoordinatorNotAvailable, true},
		{sarama.ErrNotCoordinatorForConsumer, true},
		{sarama.ErrTopicAuthorizationFailed, false},
		{&PartitionMismatchError{Topic: "t", Found: 1, Wanted: 2}, false},
		{context.Canceled, false},
	} {
		if got := IsUnreachable(c.err); got != c.want {
			t.Errorf("IsUnreachable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// persist gives up at once on an error that is not IsUnreachable, and
// returns the last error when ctx ends.
func TestPersistStops(t *testing.T) {
	calls := 0
	denied := sarama.ErrTopicAuthorizationFailed
	if err := persist(context.Background(), func() error { calls++; return denied }); !errors.Is(err, denied) || calls != 1 {
		t.Fatalf("denied: %v after %d calls, want it after 1", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err := persist(ctx, func() error {
		calls++
		if calls == 3 {
			cancel()
		}
		return syscall.ECONNREFUSED
	})
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, context.Canceled) || calls != 3 {
		t.Fatalf("cancelled: %v after %d calls, want refused and canceled after 3", err, calls)
	}
}

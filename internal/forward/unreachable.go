package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/IBM/sarama"
)

// unreachableFor bounds how long EnsureTopics and EnsureTopicsFor retry an
// admin request that no broker answered (IsUnreachable), when ctx allows
// that long. In a multi-node cluster a killed node stays in the metadata
// until the controller fences it (about 9 s with Kafka's defaults); the
// retries wait that out. A cluster that stays unreachable longer is
// reported as an error.
const unreachableFor = 30 * time.Second

// IsUnreachable reports whether err from a Kafka admin request means "this
// broker did not answer" rather than "the cluster refused the request": a
// refused or reset connection, EOF, a network timeout, or one of Kafka's
// broker-not-available, not-controller, leader-not-available,
// not-leader-for-partition or request-timed-out codes, or a coordinator
// that is not available, has moved or is still loading its state (a node
// just restarted). sarama's "run out of available brokers" counts only
// through the connection errors it wraps. Such a request is worth sending again, possibly
// to another broker; any other error (authorization, a partition mismatch,
// bad config, a refused SASL login) is not.
func IsUnreachable(err error) bool {
	var ne net.Error
	switch {
	case err == nil:
		return false
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, sarama.ErrNotConnected), errors.Is(err, sarama.ErrBrokerNotAvailable),
		errors.Is(err, sarama.ErrNotController), errors.Is(err, sarama.ErrLeaderNotAvailable),
		errors.Is(err, sarama.ErrRequestTimedOut), errors.Is(err, sarama.ErrNotLeaderForPartition),
		errors.Is(err, sarama.ErrOffsetsLoadInProgress), errors.Is(err, sarama.ErrConsumerCoordinatorNotAvailable),
		errors.Is(err, sarama.ErrNotCoordinatorForConsumer):
		return true
	case errors.As(err, &ne):
		return true
	}
	return false
}

// persist runs call until it returns nil or an error that is not
// IsUnreachable, ctx ends, or unreachableFor has passed since its first
// failure. It waits 100 ms between tries, doubling up to 2 s. The error
// returned is call's last.
func persist(ctx context.Context, call func() error) error {
	wait := 100 * time.Millisecond
	var deadline time.Time
	for {
		err := call()
		if err == nil || !IsUnreachable(err) {
			return err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(unreachableFor)
		}
		if now.Add(wait).After(deadline) {
			return err
		}
		if werr := WaitDue(ctx, now.Add(wait), nil); werr != nil {
			return fmt.Errorf("%w (%w while retrying)", err, werr)
		}
		wait = min(2*wait, 2*time.Second)
	}
}

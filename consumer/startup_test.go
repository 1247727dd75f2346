package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgconn"
)

// connClosed is pgconn's "conn closed": an error whose statement was never
// sent (pgconn.SafeToRetry).
type connClosed struct{}

func (connClosed) Error() string     { return "conn closed" }
func (connClosed) SafeToRetry() bool { return true }

func TestTransientClusterErr(t *testing.T) {
	transient := []error{
		io.EOF,
		fmt.Errorf("retrytopic: describe topic t: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		syscall.ECONNRESET,
		sarama.Wrap(sarama.ErrOutOfBrokers, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		sarama.ErrNotController,
		fmt.Errorf("wrapped: %w", sarama.ErrLeaderNotAvailable),
		sarama.ErrRequestTimedOut,
		&pgconn.PgError{Code: "57P03"},                                      // the database system is starting up
		fmt.Errorf("keyorder: migrate: %w", &pgconn.PgError{Code: "08006"}), // connection failure
		fmt.Errorf("pgmigrate: ordering: begin: %w", connClosed{}),          // the swarm: a member started as PostgreSQL restarted
	}
	for _, err := range transient {
		if !transientClusterErr(err) {
			t.Errorf("transientClusterErr(%v) = false, want true", err)
		}
	}
	final := []error{
		nil,
		errors.New("retrytopic: topic t has 3 partitions, want 12"),
		sarama.ErrTopicAuthorizationFailed,
		sarama.ErrClusterAuthorizationFailed,
		sarama.Wrap(sarama.ErrOutOfBrokers, sarama.ErrSASLAuthenticationFailed),
		sarama.ErrOutOfBrokers,
		sarama.ErrInvalidConfig,
		context.Canceled,
		&pgconn.PgError{Code: "28P01"}, // password authentication failed
		&pgconn.PgError{Code: "42501"}, // insufficient privilege
	}
	for _, err := range final {
		if transientClusterErr(err) {
			t.Errorf("transientClusterErr(%v) = true, want false", err)
		}
	}
}

// A start-up step that fails with a final error is not retried, and one that
// fails transiently is retried until it succeeds.
func TestRetryStart(t *testing.T) {
	s := setup{log: slog.New(slog.DiscardHandler)}
	client := fakeRefresher{}
	calls := 0
	err := s.retry(context.Background(), client, "x", func() error {
		calls++
		return sarama.ErrTopicAuthorizationFailed
	})
	if !errors.Is(err, sarama.ErrTopicAuthorizationFailed) || calls != 1 {
		t.Fatalf("final error: err %v after %d calls, want it after 1", err, calls)
	}
	calls = 0
	err = s.retry(context.Background(), client, "x", func() error {
		calls++
		if calls < 3 {
			return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("transient error: err %v after %d calls, want nil after 3", err, calls)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	calls = 0
	err = s.retry(ctx, client, "x", func() error { calls++; return io.EOF })
	if !errors.Is(err, io.EOF) || calls != 1 {
		t.Fatalf("cancelled: err %v after %d calls, want EOF after 1", err, calls)
	}
}

// fakeRefresher is a sarama.Client whose refreshes do nothing; retryStart
// calls only RefreshController and RefreshMetadata.
type fakeRefresher struct{ sarama.Client }

func (fakeRefresher) RefreshController() (*sarama.Broker, error) { return nil, nil }
func (fakeRefresher) RefreshMetadata(...string) error            { return nil }

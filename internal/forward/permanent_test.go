package forward

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/IBM/sarama"
)

func TestIsPermanentForwardError(t *testing.T) {
	tooBig := sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2097152 > 1048576")
	tests := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{sarama.ErrMessageSizeTooLarge, true},
		{sarama.ErrMessageSetSizeTooLarge, true},
		{sarama.ErrInvalidRecord, true},
		{sarama.ErrTopicAuthorizationFailed, true},
		{sarama.ErrClusterAuthorizationFailed, true},
		{sarama.ErrPolicyViolation, true},
		{sarama.ErrInvalidTimestamp, true},
		{tooBig, true},
		{&ForwardError{Topic: "t", Partition: 0, Err: sarama.ErrMessageSizeTooLarge}, true},
		{&ForwardError{Topic: "t", Partition: 0, Err: fmt.Errorf("%w: record is 5 bytes", sarama.ErrMessageSizeTooLarge)}, true},
		{&ForwardError{Topic: "t", Partition: 0, Err: tooBig}, true},
		{sarama.ProducerError{Err: sarama.ErrTopicAuthorizationFailed}, true},
		{&sarama.ProducerError{Err: sarama.ErrInvalidRecord}, true},
		{errors.Join(errors.New("x"), sarama.ErrInvalidRecord), true},
		// Outages: wait and retry.
		{sarama.ErrUnknownTopicOrPartition, false},
		{&ForwardError{Topic: "t", Partition: -1, Err: fmt.Errorf("partitions: %w", sarama.ErrUnknownTopicOrPartition)}, false},
		{sarama.ErrLeaderNotAvailable, false},
		{sarama.ErrNotLeaderForPartition, false},
		{sarama.ErrRequestTimedOut, false},
		{sarama.ErrNotEnoughReplicas, false},
		{sarama.ErrNotEnoughReplicasAfterAppend, false},
		{sarama.ErrOutOfBrokers, false},
		{sarama.ErrInvalidMessage, false},
		{sarama.ErrOutOfOrderSequenceNumber, false},
		{sarama.ConfigurationError("Producing headers requires Kafka at least v0.11"), false},
		{&ForwardError{Topic: "t", Partition: -1, Err: context.Canceled}, false},
		{errors.New("dial tcp: connection refused"), false},
	}
	for _, tt := range tests {
		if got := IsPermanentForwardError(tt.err); got != tt.want {
			t.Errorf("IsPermanentForwardError(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

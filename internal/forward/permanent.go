package forward

import (
	"context"
	"errors"
	"strings"

	"github.com/IBM/sarama"
)

// permanentForwardErrors are the Kafka error codes IsPermanentForwardError
// treats as permanent. Keep the list in IsPermanentForwardError's doc.
var permanentForwardErrors = []sarama.KError{
	sarama.ErrMessageSizeTooLarge,                // 10 MESSAGE_TOO_LARGE
	sarama.ErrInvalidTopic,                       // 17 INVALID_TOPIC_EXCEPTION
	sarama.ErrMessageSetSizeTooLarge,             // 18 RECORD_LIST_TOO_LARGE
	sarama.ErrTopicAuthorizationFailed,           // 29 TOPIC_AUTHORIZATION_FAILED
	sarama.ErrClusterAuthorizationFailed,         // 31 CLUSTER_AUTHORIZATION_FAILED
	sarama.ErrInvalidTimestamp,                   // 32 INVALID_TIMESTAMP
	sarama.ErrUnsupportedForMessageFormat,        // 43 UNSUPPORTED_FOR_MESSAGE_FORMAT
	sarama.ErrPolicyViolation,                    // 44 POLICY_VIOLATION
	sarama.ErrTransactionalIDAuthorizationFailed, // 53 TRANSACTIONAL_ID_AUTHORIZATION_FAILED
	sarama.ErrUnsupportedCompressionType,         // 76 UNSUPPORTED_COMPRESSION_TYPE
	sarama.ErrInvalidRecord,                      // 87 INVALID_RECORD
}

// IsPermanentForwardError reports whether err, returned by a forward (or by any
// sarama producer), means the destination refuses this record for good: no
// retry of the same record to the same topic can succeed, so waiting would
// stall the partition for ever. It is the one place idem classifies producer
// errors.
//
// Permanent (the record is dead-lettered instead: whole, or as a stub
// without its value if the dead-letter topic refuses it too):
//
//	MESSAGE_TOO_LARGE (10)                    sarama.ErrMessageSizeTooLarge, also returned by Forward
//	                                          before sending a record above Producer.MaxMessageBytes
//	RECORD_LIST_TOO_LARGE (18)                sarama.ErrMessageSetSizeTooLarge (e.g. a batch above segment.bytes)
//	INVALID_RECORD (87)                       sarama.ErrInvalidRecord (e.g. a nil key on a compacted topic)
//	INVALID_TIMESTAMP (32)                    sarama.ErrInvalidTimestamp
//	INVALID_TOPIC_EXCEPTION (17)              sarama.ErrInvalidTopic
//	TOPIC_AUTHORIZATION_FAILED (29)           sarama.ErrTopicAuthorizationFailed
//	CLUSTER_AUTHORIZATION_FAILED (31)         sarama.ErrClusterAuthorizationFailed
//	TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53) sarama.ErrTransactionalIDAuthorizationFailed
//	UNSUPPORTED_FOR_MESSAGE_FORMAT (43)       sarama.ErrUnsupportedForMessageFormat
//	POLICY_VIOLATION (44)                     sarama.ErrPolicyViolation
//	UNSUPPORTED_COMPRESSION_TYPE (76)         sarama.ErrUnsupportedCompressionType
//	sarama.ConfigurationError "Attempt to produce message larger than configured Producer.MaxMessageBytes"
//	                                          (sarama's own client-side size check)
//
// Everything else is an outage (false): the partition waits and retries the
// same forward. That includes UNKNOWN_TOPIC_OR_PARTITION (3, a deleted
// topic: it may be created again), LEADER_NOT_AVAILABLE (5),
// NOT_LEADER_OR_FOLLOWER (6), REQUEST_TIMED_OUT (7), NETWORK_EXCEPTION (13),
// CORRUPT_MESSAGE (2, a CRC error on the way), NOT_ENOUGH_REPLICAS (19, 20),
// OUT_OF_ORDER_SEQUENCE_NUMBER (45), broker and
// network errors (sarama.ErrOutOfBrokers, net.Error, io.EOF), and context
// cancellation. err may be wrapped (the consumer's forward errors,
// sarama.ProducerError,
// fmt.Errorf %w, errors.Join: permanent if any joined error is).
func IsPermanentForwardError(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	for _, k := range permanentForwardErrors {
		if errors.Is(err, k) {
			return true
		}
	}
	var ce sarama.ConfigurationError
	if errors.As(err, &ce) && strings.Contains(string(ce), "larger than configured Producer.MaxMessageBytes") {
		return true
	}
	return false
}

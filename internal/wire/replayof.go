package wire

import (
	"strconv"
	"strings"

	"github.com/IBM/sarama"
)

// HeaderReplayOf is the header a replayed record carries: the dead-letter
// record it was replayed from, as "<dlq topic>/<partition>/<offset>"
// (ReplayOf). Every replay writes it (dlq.Client.Replay, and the failure
// console's replay and edit-and-retry, through forward.Replay and
// internal/failidx), replacing any earlier one, so a record replayed twice
// names the latest dead letter.
//
// It is not one of the wire contract's headers (IsIdemHeader is false for
// it): Encode and StripHeaders keep it, so a replayed record that fails
// again reaches the dead-letter topic with it, and the failure index links
// the new dead letter to the one it came from (dlq.Record.ReplayedFrom).
const HeaderReplayOf = "idem-replay-of"

// ReplayOf returns the HeaderReplayOf value that names the record of topic
// at partition and offset.
func ReplayOf(topic string, partition int32, offset int64) string {
	return topic + "/" + strconv.FormatInt(int64(partition), 10) + "/" + strconv.FormatInt(offset, 10)
}

// ParseReplayOf parses a HeaderReplayOf value: ok is false when s is not
// "<topic>/<partition>/<offset>" with a non-empty topic and non-negative
// numbers (a topic name cannot hold '/', so the last two '/' split it).
func ParseReplayOf(s string) (topic string, partition int32, offset int64, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return "", 0, 0, false
	}
	j := strings.LastIndexByte(s[:i], '/')
	if j <= 0 {
		return "", 0, 0, false
	}
	part, err1 := strconv.ParseInt(s[j+1:i], 10, 32)
	off, err2 := strconv.ParseInt(s[i+1:], 10, 64)
	if err1 != nil || err2 != nil || part < 0 || off < 0 {
		return "", 0, 0, false
	}
	return s[:j], int32(part), off, true
}

// WithReplayOf returns hs without any HeaderReplayOf, followed by one naming
// the dead-letter record of topic at partition and offset. hs is not
// changed.
func WithReplayOf(hs []sarama.RecordHeader, topic string, partition int32, offset int64) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, 0, len(hs)+1)
	for _, h := range hs {
		if string(h.Key) != HeaderReplayOf {
			out = append(out, h)
		}
	}
	return append(out, sarama.RecordHeader{Key: []byte(HeaderReplayOf), Value: []byte(ReplayOf(topic, partition, offset))})
}

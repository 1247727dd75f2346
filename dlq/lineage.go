package dlq

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/IBM/sarama"
)

// ReplayOfHeader is the header a replayed record carries: the dead-letter
// record it was replayed from, as "<dlq topic>/<partition>/<offset>"
// (ReplayOf). Replay, Record.ReplayRecord and the failure console's replay and
// edit-and-retry write it, replacing any earlier one (a record replayed twice
// names the latest dead letter). It is not one of retrytopic's wire-contract
// headers, so a consumer's forwards keep it: a replayed record that fails
// again reaches the dead-letter topic with it, and the failure index links
// the new dead letter to the one it came from (Record.ReplayedFrom).
const ReplayOfHeader = "idem-replay-of"

// ReplayOf returns the ReplayOfHeader value that names the record of topic
// at p.
func ReplayOf(topic string, p Position) string {
	return fmt.Sprintf("%s/%d/%d", topic, p.Partition, p.Offset)
}

// parseReplayOf parses a ReplayOfHeader value: ok is false when s is not
// "<topic>/<partition>/<offset>" (a topic name cannot hold '/', so the last
// two '/' split it).
func parseReplayOf(s string) (topic string, p Position, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return "", Position{}, false
	}
	j := strings.LastIndexByte(s[:i], '/')
	if j <= 0 {
		return "", Position{}, false
	}
	part, err1 := strconv.ParseInt(s[j+1:i], 10, 32)
	off, err2 := strconv.ParseInt(s[i+1:], 10, 64)
	if err1 != nil || err2 != nil || part < 0 || off < 0 {
		return "", Position{}, false
	}
	return s[:j], Position{Partition: int32(part), Offset: off}, true
}

// ReplayedFrom returns the dead-letter record r was replayed from: its last
// ReplayOfHeader. ok is false when r has none, or it does not parse.
func (r *Record) ReplayedFrom() (topic string, p Position, ok bool) {
	v, found := r.header(ReplayOfHeader)
	if !found {
		return "", Position{}, false
	}
	return parseReplayOf(v)
}

// WithReplayOf returns hs without any ReplayOfHeader, followed by one naming
// the dead-letter record of topic at p. hs is not changed.
func WithReplayOf(hs []sarama.RecordHeader, topic string, p Position) []sarama.RecordHeader {
	out := make([]sarama.RecordHeader, 0, len(hs)+1)
	for _, h := range hs {
		if string(h.Key) != ReplayOfHeader {
			out = append(out, h)
		}
	}
	return append(out, sarama.RecordHeader{Key: []byte(ReplayOfHeader), Value: []byte(ReplayOf(topic, p))})
}

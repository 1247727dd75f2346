// This file is the record a replay sends for a dead letter (Replay), built
// by the one code path for every replay idem makes: dlq.Client.Replay (and
// so `idem dlq replay`) and the failure console's replay (internal/failidx,
// and so `idem dlq replay --database-url` and the console's UI and API).
// It does not import package dlq, which imports this package: a caller
// passes the dead letter's fields as a DeadLetter.

package forward

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// ReplayToSource is the destination that sends each record back to its
// idem-original-topic as a fresh record (dlq.ReplayOptions.To "" means it
// too; the CLI and the console spell it "source").
const ReplayToSource = "source"

// ErrNoOrigin is wrapped by Replay's error when, replaying to ReplayToSource, the
// record lacks the idem-original-topic header it needs to be routed.
// dlq.ErrNoOrigin is this error.
var ErrNoOrigin = errors.New("dlq: record has no idem-original-topic header")

// DeadLetter is a dead-letter record as a replay reads it: where it is, its
// bytes, and its decoded idem-* headers (as dlq.Record holds them).
type DeadLetter struct {
	// Topic, Partition and Offset locate it in its dead-letter topic.
	Topic     string
	Partition int32
	Offset    int64
	// Key and Value are the raw bytes, sent as they are.
	Key, Value []byte
	// Headers are all its headers, in order.
	Headers []sarama.RecordHeader
	// Failure is what the idem-* headers say; HasFailure whether it had any.
	Failure    retrytopic.Failure
	HasFailure bool
}

// Replay returns the record a replay sends for d to to, without sending it:
//
//   - to ReplayToSource (or "", or a topic equal to d's idem-original-topic): to
//     the original topic and partition, with only the original headers (none
//     of the wire contract's), so the consumer sees a fresh record; without
//     an idem-original-topic, an error wrapping ErrNoOrigin;
//   - to another topic, for a record with idem-* headers: the headers kept,
//     with idem-due-at set to now and idem-tier to tier, or when tier is 0 to
//     n when to is the default name of tier n of the record's original topic
//     and group (else 1), so a consumer reading that topic as a tier handles
//     it at once;
//   - to another topic, for a record without idem-* headers: its headers as
//     they are, to its own partition number.
//
// Whatever the destination, the record also carries wire.HeaderReplayOf
// naming d. A stub (its value was left out) is an error: it is never
// replayed.
func Replay(d DeadLetter, to string, tier int, now time.Time) (Record, error) {
	f := d.Failure
	if f.Stub {
		return Record{}, fmt.Errorf("dlq: %s/%d offset %d is a stub (value omitted): it is never replayed", d.Topic, d.Partition, d.Offset)
	}
	if to == "" {
		to = ReplayToSource
	}
	rec := Record{Partition: f.OriginalPartition, Key: d.Key, Value: d.Value}
	switch {
	case to == ReplayToSource || (d.HasFailure && to == f.OriginalTopic):
		if f.OriginalTopic == "" {
			return rec, fmt.Errorf("%w (offset %d)", ErrNoOrigin, d.Offset)
		}
		rec.Topic = f.OriginalTopic
		rec.Headers = wire.StripHeaders(d.Headers)
	case !d.HasFailure:
		rec.Topic, rec.Partition = to, d.Partition
		rec.Headers = d.Headers
	default:
		rec.Topic = to
		f.Tier, f.DueAt = tier, now
		if f.Tier == 0 {
			f.Tier = tierOf(rec.Topic, f.OriginalTopic, f.Group)
		}
		rec.Headers = wire.Encode(d.Headers, f)
	}
	rec.Headers = wire.WithReplayOf(rec.Headers, d.Topic, d.Partition, d.Offset)
	return rec, nil
}

// ErrReplayTarget is wrapped by CheckReplayTarget's error: a replay may not go to that
// topic (the console answers it with 400).
var ErrReplayTarget = errors.New("dlq: not a replay target of the record")

// CheckReplayTarget says whether a dead letter of origin topic origin, failed by
// consumer group group, may be replayed to to: its origin topic (to "",
// ReplayToSource or origin itself) or a retry tier of origin for group under
// idem's default names ("<origin>.<group>.retry.<n>", n >= 1), or a topic
// listed in allowed (listed is then true, so an audit can say so). Anything
// else is an error wrapping ErrReplayTarget: a replay never writes into another
// team's topic or into a topic that reads payloads back out unaudited.
func CheckReplayTarget(origin, group, to string, allowed []string) (listed bool, err error) {
	switch {
	case to == "" || to == ReplayToSource || (origin != "" && to == origin):
		return false, nil
	case origin != "" && isTier(to, origin, group):
		return false, nil
	}
	for _, t := range allowed {
		if t == to {
			return true, nil
		}
	}
	if origin == "" {
		return false, fmt.Errorf("%w: %q: the record has no idem-original-topic, so only a topic listed as an allowed replay target (--replay-topic) may take it", ErrReplayTarget, to)
	}
	return false, fmt.Errorf("%w: %q is neither the record's origin topic %q nor one of its retry tiers for group %q (%s); list other targets as allowed replay topics (--replay-topic)",
		ErrReplayTarget, to, origin, group, (retrytopic.Policy{}).Tier(origin, group, 1)+", …")
}

// isTier reports whether topic is the default name of a retry tier n >= 1
// of orig for group.
func isTier(topic, orig, group string) bool {
	i := strings.LastIndexByte(topic, '.')
	n, err := strconv.Atoi(topic[i+1:])
	return err == nil && n >= 1 && (retrytopic.Policy{}).Tier(orig, group, n) == topic
}

// tierOf returns n when topic is the default name of tier n of orig for
// group ("<orig>.<group>.retry.<n>"), else 1.
func tierOf(topic, orig, group string) int {
	if isTier(topic, orig, group) {
		n, _ := strconv.Atoi(topic[strings.LastIndexByte(topic, '.')+1:])
		return n
	}
	return 1
}

package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/internal/committed"
)

// Window resolves r's window in Kafka, now: for each partition of r.Topic
// (or r.Partition), its start (the first offset whose record's timestamp is
// at or after r.From, or r.FromOffset) and its end, exclusive (the first
// offset at or after r.Until, else the partition's last stable offset: the
// end is fixed at the request, so records written afterwards are never part
// of it). A start below the log start offset (deleted by retention) starts
// at the log start. An unknown topic or partition is an *InputError.
func Window(ctx context.Context, client sarama.Client, r RedriveRequest) ([]Part, error) {
	if err := r.checkWindow(); err != nil {
		return nil, err
	}
	if err := client.RefreshMetadata(r.Topic); err != nil && !errors.Is(err, sarama.ErrUnknownTopicOrPartition) {
		return nil, fmt.Errorf("control: metadata of %s: %w", r.Topic, err)
	}
	all, err := client.Partitions(r.Topic)
	if err != nil || len(all) == 0 {
		return nil, invalid("topic", "%s: no such topic (%v)", r.Topic, err)
	}
	ps := all
	if r.Partition != AllPartitions {
		if !slices.Contains(all, r.Partition) {
			return nil, invalid("partition", "%s has no partition %d (it has %d)", r.Topic, r.Partition, len(all))
		}
		ps = []int32{r.Partition}
	}
	slices.Sort(ps)
	out := make([]Part, 0, len(ps))
	for _, p := range ps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		part, err := window(client, r, p)
		if err != nil {
			return nil, fmt.Errorf("control: window of %s/%d: %w", r.Topic, p, err)
		}
		out = append(out, part)
	}
	return out, nil
}

// window resolves r's window in partition p.
func window(client sarama.Client, r RedriveRequest, p int32) (Part, error) {
	first, err := client.GetOffset(r.Topic, p, sarama.OffsetOldest)
	if err != nil {
		return Part{}, err
	}
	end, err := committed.End(client, r.Topic, p)
	if err != nil {
		return Part{}, err
	}
	at := func(t time.Time) (int64, error) { // the first offset at or after t; end when none
		o, err := client.GetOffset(r.Topic, p, t.UnixMilli())
		if err != nil || o < 0 {
			return end, err
		}
		return min(o, end), nil
	}
	start := r.FromOffset
	if !r.From.IsZero() {
		if start, err = at(r.From); err != nil {
			return Part{}, err
		}
	}
	if !r.Until.IsZero() {
		if end, err = at(r.Until); err != nil {
			return Part{}, err
		}
	}
	start = min(max(start, first), end)
	return Part{Partition: p, Start: start, End: end, Next: start}, nil
}

// ParseWhen parses a time of a re-drive's window: an RFC 3339 time, a
// datetime-local value ("2006-01-02T15:04", UTC), or a duration that long
// before now ("90m", "1h"). "" is the zero time.
func ParseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04:05", "2006-01-02 15:04"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q: want an RFC 3339 time (2026-12-04T09:00:00Z) or how long ago (1h, 90m)", s)
}

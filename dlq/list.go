package dlq

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/committed"
)

// Group is the pending records of a dead-letter topic that failed the same way
// (same Fingerprint).
type Group struct {
	// Fingerprint is Fingerprint(Kind, ErrorType, SampleError).
	Fingerprint string `json:"fingerprint"`
	// Kind and ErrorType are the group's idem-error-kind and idem-error-type.
	Kind      handler.Kind `json:"kind"`
	ErrorType string       `json:"error_type"`
	// Message is the normalised error message (see Normalize).
	Message string `json:"message"`
	// SampleError is the full error message of the sample record.
	SampleError string `json:"sample_error"`
	// Count is how many pending records are in the group.
	Count int64 `json:"count"`
	// FirstSeen and LastSeen span the records' last failure times
	// (idem-last-failure-at, or the record timestamp without it).
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Stubs is how many of the records are stubs (value omitted; Replay
	// never sends them).
	Stubs int64 `json:"stubs"`
	// SamplePartition and SampleOffset locate the group's first record (for Show).
	SamplePartition int32 `json:"sample_partition"`
	SampleOffset    int64 `json:"sample_offset"`
}

// List reads the pending records of topic (from the admin group's committed
// offset to the end) and groups them by fingerprint. Groups come largest
// first, then most recently seen first. Nothing is committed.
func (c *Client) List(ctx context.Context, topic string) ([]Group, error) {
	spans, err := c.pending(ctx, topic)
	if err != nil {
		return nil, err
	}
	byFP := map[string]*Group{}
	err = c.scan(ctx, topic, spans, func(r *Record) error {
		fp := r.Fingerprint()
		g, ok := byFP[fp]
		if !ok {
			g = newGroup(r, fp)
			byFP[fp] = g
		}
		g.add(r)
		return nil
	})
	if err != nil {
		return nil, err
	}
	groups := make([]Group, 0, len(byFP))
	for _, g := range byFP {
		groups = append(groups, *g)
	}
	sort.Slice(groups, func(i, j int) bool {
		a, b := groups[i], groups[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		if !a.LastSeen.Equal(b.LastSeen) {
			return a.LastSeen.After(b.LastSeen)
		}
		return a.Fingerprint < b.Fingerprint
	})
	return groups, nil
}

// newGroup starts an empty group (Count 0) of records like r, whose
// fingerprint is fp, with r as its sample.
func newGroup(r *Record, fp string) *Group {
	seen := r.LastFailureAt()
	return &Group{
		Fingerprint: fp, Kind: r.Failure.Kind, ErrorType: r.Failure.ErrorType,
		Message: normalize(r.Failure.Error), SampleError: r.Failure.Error,
		FirstSeen: seen, LastSeen: seen, SamplePartition: r.Partition, SampleOffset: r.Offset,
	}
}

// add counts r in g and widens g's first/last seen times to include it.
func (g *Group) add(r *Record) {
	seen := r.LastFailureAt()
	g.Count++
	if r.IsStub() {
		g.Stubs++
	}
	if seen.Before(g.FirstSeen) {
		g.FirstSeen = seen
	}
	if seen.After(g.LastSeen) {
		g.LastSeen = seen
	}
}

// Position selects a record for Show: by Key when Key is not empty, else by
// Partition and Offset.
type Position struct {
	Partition int32
	Offset    int64
	// Key matches the record key, its derived idempotency key
	// (idem-idempotency-key) or its idempotency-key header.
	Key string
}

// Show returns one record of topic with its failure decoded. By offset it
// returns the record at Partition/Offset; by key, the most recent record in
// the whole topic (pending or not) whose key or idempotency-key header equals
// Key. It returns an error wrapping ErrNotFound when there is none.
func (c *Client) Show(ctx context.Context, topic string, at Position) (*Record, error) {
	parts, err := c.partitions(topic)
	if err != nil {
		return nil, err
	}
	var spans []span
	for _, p := range parts {
		if at.Key == "" && p != at.Partition {
			continue
		}
		oldest, err := c.client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		newest, err := committed.End(c.client, topic, p)
		if err != nil {
			return nil, err
		}
		s := span{Partition: p, Start: oldest, End: newest}
		if at.Key == "" {
			if at.Offset < oldest || at.Offset >= newest {
				return nil, notFound(topic, at)
			}
			s.Start, s.End = at.Offset, at.Offset+1
		}
		spans = append(spans, s)
	}
	if len(spans) == 0 {
		return nil, notFound(topic, at)
	}
	var found *Record
	err = c.scan(ctx, topic, spans, func(r *Record) error {
		if at.Key == "" {
			if r.Offset == at.Offset {
				found = r
			}
			return nil
		}
		if r.HasKey(at.Key) {
			if found == nil || r.Timestamp.After(found.Timestamp) || r.Timestamp.Equal(found.Timestamp) {
				found = r
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil {
		return nil, notFound(topic, at)
	}
	return found, nil
}

func notFound(topic string, at Position) error {
	if at.Key != "" {
		return &notFoundError{what: fmt.Sprintf("key %q in %s", at.Key, topic)}
	}
	return &notFoundError{what: fmt.Sprintf("%s partition %d offset %d", topic, at.Partition, at.Offset)}
}

type notFoundError struct{ what string }

func (e *notFoundError) Error() string { return ErrNotFound.Error() + ": " + e.what }
func (e *notFoundError) Unwrap() error { return ErrNotFound }

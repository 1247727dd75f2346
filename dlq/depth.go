package dlq

import "context"

// PartitionDepth is how many records of one partition of a dead-letter topic
// are pending.
type PartitionDepth struct {
	// Partition is the partition number.
	Partition int32 `json:"partition"`
	// Start is the first pending offset: the admin group's committed offset,
	// or the earliest retained offset when that is later (nothing committed,
	// or the committed records deleted by retention).
	Start int64 `json:"start"`
	// End is the partition's last stable offset: its end offset (the
	// offset of the next record), unless a transaction is open there.
	End int64 `json:"end"`
	// Committed is the admin group's committed offset, -1 when it has none.
	Committed int64 `json:"committed"`
	// Pending is how many dead letters are in [Start, End): End - Start
	// for a topic written without transactions; with transactions, the
	// records a read_committed consumer gets there (commit markers and
	// aborted records take offsets and are not counted).
	Pending int64 `json:"pending"`
}

// DepthByPartition returns, per partition in order, what Depth sums: the
// dead letters of topic past the admin group's committed offsets.
func (c *Client) DepthByPartition(ctx context.Context, topic string) ([]PartitionDepth, error) {
	spans, err := c.pending(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make([]PartitionDepth, 0, len(spans))
	for _, s := range spans {
		n, err := c.count(ctx, topic, s)
		if err != nil {
			return nil, err
		}
		out = append(out, PartitionDepth{Partition: s.Partition, Start: s.Start, End: s.End, Committed: s.Committed, Pending: n})
	}
	return out, nil
}

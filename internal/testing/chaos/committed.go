package chaos

import (
	"fmt"
	"slices"
	"time"

	"github.com/IBM/sarama"
)

// This file reads topics as a read_committed reader sees them, for the
// transactional runs (Options.Transactions): the members' forwards and the
// relay's events are written in Kafka transactions, so a log holds records
// of aborted transactions and a control record (commit or abort marker) after
// each transaction.

// readCommitted returns the records of topic/partition in [from, end) that
// a read_committed reader gets: control records and the records of aborted
// transactions are left out. With first it returns once it found one. It
// fetches directly (sarama's consumer does not say where it stands, and a
// log may end with markers it never delivers), up to the last stable offset;
// while an open transaction holds that back it waits up to wait, then fails.
func readCommitted(client sarama.Client, topic string, p int32, from, end int64, first bool, wait time.Duration) ([]rawRecord, error) {
	var out []rawRecord
	aborted := map[int64]bool{} // producers whose aborted transaction spans the current offset
	deadline := time.Now().Add(wait)
	for off := from; off < end; {
		leader, err := client.Leader(topic, p)
		if err != nil {
			return nil, err
		}
		req := &sarama.FetchRequest{Version: 11, MaxWaitTime: 100, MinBytes: 1, MaxBytes: 8 << 20, Isolation: sarama.ReadCommitted}
		req.AddBlock(topic, p, off, 4<<20, -1)
		resp, err := leader.Fetch(req)
		if err != nil {
			return nil, fmt.Errorf("fetch %s/%d at %d: %w", topic, p, off, err)
		}
		b := resp.GetBlock(topic, p)
		if b == nil {
			return nil, fmt.Errorf("fetch %s/%d at %d: no block in the response", topic, p, off)
		}
		if b.Err != sarama.ErrNoError {
			return nil, fmt.Errorf("fetch %s/%d at %d: %w", topic, p, off, b.Err)
		}
		pending := slices.Clone(b.AbortedTransactions)
		slices.SortFunc(pending, func(a, b *sarama.AbortedTransaction) int { return int(a.FirstOffset - b.FirstOffset) })
		moved := false
		for _, rs := range b.RecordsSet {
			rb := rs.RecordBatch
			if rb == nil || rb.PartialTrailingRecord && len(rb.Records) == 0 {
				continue
			}
			last := rb.FirstOffset + int64(rb.LastOffsetDelta)
			if last < off {
				continue
			}
			for len(pending) > 0 && pending[0].FirstOffset <= last {
				aborted[pending[0].ProducerID] = true
				pending = pending[1:]
			}
			switch {
			case rb.Control: // a marker ends its producer's transaction
				delete(aborted, rb.ProducerID)
			case rb.IsTransactional && aborted[rb.ProducerID]:
			default:
				for _, r := range rb.Records {
					o := rb.FirstOffset + r.OffsetDelta
					if o < off || o >= end {
						continue
					}
					rec := rawRecord{partition: p, offset: o, value: r.Value, headers: map[string]string{}}
					for _, h := range r.Headers {
						rec.headers[string(h.Key)] = string(h.Value)
					}
					out = append(out, rec)
					if first {
						return out, nil
					}
				}
			}
			off, moved = last+1, true
		}
		if !moved {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("read %s/%d: stuck at offset %d of %d (a transaction still open)", topic, p, off, end)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return out, nil
}

// readTopicCommitted reads every record of topic a read_committed reader
// gets.
func readTopicCommitted(client sarama.Client, topic string) ([]rawRecord, error) {
	ps, err := client.Partitions(topic)
	if err != nil {
		return nil, err
	}
	var out []rawRecord
	for _, p := range ps {
		start, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return nil, err
		}
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return nil, err
		}
		recs, err := readCommitted(client, topic, p, start, end, false, time.Minute)
		if err != nil {
			return nil, err
		}
		out = append(out, recs...)
	}
	return out, nil
}

// settledEnd is where a group that committed committed (-1: nothing) has
// nothing left to read in topic/partition, whose log ends at end: end, or
// committed (0 for nothing) when what lies between is only transaction
// markers and aborted records (a consumer commits the offset after its last
// record, which a marker may follow; it commits nothing in a partition that
// holds no record for it, as a tier whose only forwards were aborted). An
// open transaction counts as left to read.
func settledEnd(client sarama.Client, topic string, p int32, committed, end int64) int64 {
	from := committed
	if from < 0 {
		oldest, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return end
		}
		from = oldest
	}
	if from >= end { // nothing in the log past the commit (or, with none, at all)
		if committed < 0 {
			return 0
		}
		return end
	}
	recs, err := readCommitted(client, topic, p, from, end, true, 0)
	if err != nil || len(recs) > 0 {
		return end
	}
	return max(committed, 0)
}

package failidx

import (
	"testing"

	"github.com/idemhq/idem/internal/testing/failidxtest"
)

// TestLineageFollowsReplayOf: a dead letter whose idem-replay-of names an
// indexed record is linked to that record (PreviousID), even when a later
// failure of the same idempotency key was indexed in between; within one
// batch too. Without the header, or when it names a record the index does
// not hold, the link falls back to the latest record of the same key,
// origin and group.
func TestLineageFollowsReplayOf(t *testing.T) {
	pool, _ := failidxtest.NewPool(t)
	const topic = "pay.billing.dlq"
	d := func(key, replayOf string) dead {
		return dead{Topic: topic, Origin: "pay", Key: key, Value: []byte(`{}`), Err: "ledger rejected", ReplayOf: replayOf}
	}
	// Offsets 0 and 1: two failures of k1; offset 2 is the replay of the
	// first that failed again.
	index(t, pool, 0, d("k1", ""), d("k1", ""))
	index(t, pool, 2, d("k1", topic+"/0/0"))
	// One batch: two failures of k2 and the replay of the first.
	index(t, pool, 10, d("k2", ""), d("k2", ""), d("k2", topic+"/0/10"))
	// A replay of a record the index never held: by key.
	index(t, pool, 20, d("k1", topic+"/0/999"))
	// A replay whose header does not parse: by key.
	index(t, pool, 21, d("k2", "not a position"))

	id := func(off int64) int64 {
		return failidxtest.Count(t, pool, `SELECT id FROM idem_dlq_records WHERE dlq_topic = $1 AND dlq_offset = $2`, topic, off)
	}
	prev := func(off int64) int64 {
		return failidxtest.Count(t, pool, `SELECT coalesce(previous_id, 0) FROM idem_dlq_records WHERE dlq_topic = $1 AND dlq_offset = $2`, topic, off)
	}
	for _, c := range []struct {
		name      string
		off, want int64
	}{
		{"second failure of k1, by key", 1, id(0)},
		{"replay of offset 0, across batches", 2, id(0)},
		{"second failure of k2, in the batch, by key", 11, id(10)},
		{"replay of offset 10, in the batch", 12, id(10)},
		{"replay of a record not indexed, by key", 20, id(2)},
		{"unparsable idem-replay-of, by key", 21, id(12)},
	} {
		if got := prev(c.off); got != c.want {
			t.Errorf("%s: offset %d has PreviousID %d, want %d", c.name, c.off, got, c.want)
		}
	}
}

package index

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

const (
	childSchema    = "IDEM_INDEX_SCHEMA"
	childGroup     = "IDEM_INDEX_GROUP"
	childTopic     = "IDEM_INDEX_TOPIC"
	childHoldAfter = "IDEM_INDEX_HOLD_AFTER"
)

// TestIndexerChildProcess is not a test: TestIndexerUnderSIGKILL runs the
// test binary again with only this function (testenv.StartChild). It runs
// an Indexer, printing "stored N" after each committed batch (N in total).
// With IDEM_INDEX_HOLD_AFTER=M, once M records are stored it prints "hold"
// and blocks right after a batch's commit, before its offsets are marked,
// until the parent SIGKILLs it. Without the variable it returns at once.
func TestIndexerChildProcess(t *testing.T) {
	if !testenv.InChild("TestIndexerChildProcess") {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a safety net
	defer cancel()
	hold, _ := strconv.ParseInt(os.Getenv(childHoldAfter), 10, 64)
	k := testenv.NewKafka(t)
	var total atomic.Int64
	ix := &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: testenv.PoolOnSchema(t, os.Getenv(childSchema)),
		Group: os.Getenv(childGroup), Topics: []string{os.Getenv(childTopic)}, BatchSize: 50}
	ix.stored = func(n int) {
		got := total.Add(int64(n))
		fmt.Printf("stored %d\n", got)
		if hold > 0 && got >= hold {
			fmt.Println("hold")
			<-ctx.Done() // committed, not marked: wait to be killed
		}
	}
	err := ix.Run(ctx)
	t.Fatalf("child: Run returned %v before it was killed", err)
}

// killChild runs the indexer in a child process and SIGKILLs it: at its
// "hold" line when hold > 0, else as soon as it has stored at least after
// records.
func killChild(t *testing.T, schema, group, topic string, hold, after int64) {
	t.Helper()
	c := testenv.StartChild(t, "TestIndexerChildProcess", childSchema+"="+schema, childGroup+"="+group, childTopic+"="+topic,
		childHoldAfter+"="+strconv.FormatInt(hold, 10))
	reached, ok := c.WaitFor(func(line string) bool {
		if hold > 0 {
			return line == "hold"
		}
		n, ok := strings.CutPrefix(line, "stored ")
		v, _ := strconv.ParseInt(n, 10, 64)
		return ok && v >= after
	})
	if !ok {
		t.Fatalf("child: exited before it was to be killed; stderr:\n%s", c.Stderr())
	}
	c.Kill(t)
	t.Logf("child killed at %q", reached)
}

// TestIndexerUnderSIGKILL kills the indexer twice while it works through
// 3,000 dead letters: once right after a batch's commit and before its
// offsets are marked, once at an arbitrary point mid-stream. Restarted, it
// indexes every record exactly once, and the lineage of repeated failures is
// the same as in an uninterrupted run.
func TestIndexerUnderSIGKILL(t *testing.T) {
	const n, originals = 3000, 2000
	k := testenv.NewKafka(t)
	pool, schema := failidxtest.NewPool(t)
	dlqTopic, origin := k.Topic(t, 3), k.Topic(t, 3)
	group := testenv.Group(t)
	var ds []dead
	for i := range n {
		key := i
		if i >= originals {
			key = i - originals // a later failure of the same message
		}
		ds = append(ds, dead{Topic: dlqTopic, Partition: int32(key % 3), Origin: origin, Key: fmt.Sprint("k-", key),
			Value: []byte(fmt.Sprintf(`{"n":%d}`, i)), Err: fmt.Sprintf("boom %d", i)})
	}
	failidxtest.Produce(t, k, ds...)

	killChild(t, schema, group, dlqTopic, n/3, 0)
	if got := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records`); got < n/3 {
		t.Fatalf("after the first kill: %d rows, want >= %d", got, n/3)
	}
	killChild(t, schema, group, dlqTopic, 0, 2*n/3-failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records`))
	t.Logf("after the second kill: %d rows", failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records`))

	runIndexer(t, &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: group, Topics: []string{dlqTopic}, BatchSize: 50})
	failidxtest.WaitCount(t, pool, n, `SELECT count(*) FROM idem_dlq_records`)
	testenv.Eventually(t, 60*time.Second, func() error {
		if lag, err := groupLag(k, group, dlqTopic); err != nil || lag != 0 {
			return fmt.Errorf("lag %d, %v", lag, err)
		}
		return nil
	})
	if got := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records`); got != n {
		t.Fatalf("%d rows, want %d", got, n)
	}
	// Every offset of every partition once.
	if got := failidxtest.Count(t, pool, `SELECT count(*) FROM (SELECT dlq_partition FROM idem_dlq_records
		GROUP BY dlq_partition HAVING max(dlq_offset) - min(dlq_offset) + 1 = count(*) AND min(dlq_offset) = 0) p`); got != 3 {
		t.Fatalf("%d of 3 partitions hold every offset from 0 exactly once", got)
	}
	// Each repeat links to its original, each original to nothing.
	if got := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records r JOIN idem_dlq_records p ON r.previous_id = p.id
		WHERE p.idempotency_key = r.idempotency_key AND p.previous_id IS NULL AND p.dlq_offset < r.dlq_offset`); got != n-originals {
		t.Fatalf("%d repeats link to their original, want %d", got, n-originals)
	}
	if got := failidxtest.Count(t, pool, `SELECT count(*) FROM idem_dlq_records WHERE previous_id IS NULL`); got != originals {
		t.Fatalf("%d records without a previous one, want %d", got, originals)
	}
}

package index

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/dlq"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestIndexerGroupFollowsTheDatabase: two consoles' indexers with the
// default group, on two databases (here two schemas) and one broker, each
// index every dead letter: the default group derives from the database, so
// they do not split the DLQ's partitions between them.
func TestIndexerGroupFollowsTheDatabase(t *testing.T) {
	k := testenv.NewKafka(t)
	topic, origin := k.Topic(t, 2), k.Topic(t, 1)
	var ds []dead
	for i := range 6 {
		ds = append(ds, dead{Topic: topic, Partition: int32(i % 2), Origin: origin, Key: fmt.Sprint("k-", i), Value: []byte(`{}`), Err: "boom"})
	}
	failidxtest.Produce(t, k, ds...)
	var groups []string
	for range 2 {
		pool, _ := failidxtest.NewPool(t)
		g, err := defaultGroup(testenv.Context(t), pool)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(g, "idem-console-indexer-") {
			t.Errorf("default group %q", g)
		}
		groups = append(groups, g)
		t.Cleanup(func() { _ = k.Admin(t).DeleteConsumerGroup(g) })
		runUntil(t, &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Topics: []string{topic}, RefreshInterval: 200 * time.Millisecond})
		defer failidxtest.WaitCount(t, pool, 6, `SELECT count(*) FROM idem_dlq_records`)
	}
	if groups[0] == groups[1] {
		t.Errorf("two databases, one default group %s", groups[0])
	}
}

// TestIndexerMovesTheAdminGroup: with an indexer running, settling records
// in the index (resolve, archive, replay) moves the DLQ's admin group up to
// the first record not settled, so idem_dlq_depth (dlq.Client.Depth) falls
// as the console works; a record settled after an unsettled one still
// counts until that one is settled.
func TestIndexerMovesTheAdminGroup(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
	topic, origin := k.Topic(t, 1), k.Topic(t, 1)
	var ds []dead
	for i := range 4 {
		ds = append(ds, dead{Topic: topic, Origin: origin, Key: fmt.Sprint("k-", i), Value: []byte(`{}`), Err: "boom"})
	}
	failidxtest.Produce(t, k, ds...)
	runUntil(t, &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Topics: []string{topic}, Group: testenv.Group(t),
		RefreshInterval: 200 * time.Millisecond})
	failidxtest.WaitCount(t, pool, 4, `SELECT count(*) FROM idem_dlq_records`)
	s := failidx.NewStore(pool)
	recs := mustList(t, s, failidx.Filter{Topic: topic})
	byKey := map[string]int64{}
	for _, r := range recs {
		byKey[r.IdempotencyKey] = r.ID
	}
	d := dlq.New(failidxtest.Client(t, k, k.SaramaConfig()))
	waitDepth := func(want int64) {
		t.Helper()
		testenv.Eventually(t, 60*time.Second, func() error {
			n, err := d.Depth(context.Background(), topic)
			if err != nil || n != want {
				return fmt.Errorf("depth %d, %v; want %d", n, err, want)
			}
			return nil
		})
	}
	act := failidx.NewActions(s, nil)
	resolve := func(keys ...string) {
		t.Helper()
		var ids []int64
		for _, key := range keys {
			ids = append(ids, byKey[key])
		}
		if _, err := act.Resolve(testenv.Context(t), "alice", failidx.Selection{IDs: ids}, ""); err != nil {
			t.Fatal(err)
		}
	}
	waitDepth(4)
	resolve("k-0", "k-1")
	waitDepth(2)
	resolve("k-3")
	waitDepth(2) // k-2 is first, unresolved
	resolve("k-2")
	waitDepth(0)
}

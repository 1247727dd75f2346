package index

import (
	"testing"

	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/testing/failidxtest"
	"github.com/idemhq/idem/internal/testing/testenv"
)

// TestExpiredRecordsStayIndexed deletes the records from the DLQ topic (as
// retention would) after the indexer stored them: Get still returns the
// payload, and replay publishes it from the index. A value the index holds
// truncated cannot be replayed once Kafka lost it: it stays unresolved and
// the result says why.
func TestExpiredRecordsStayIndexed(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := failidxtest.NewPool(t)
	ctx := testenv.Context(t)
	dlqTopic, origin := k.Topic(t, 1), k.Topic(t, 1)
	failidxtest.Produce(t, k,
		dead{Topic: dlqTopic, Origin: origin, Key: "small", Value: []byte(`{"payment":"small"}`), Err: "boom"},
		dead{Topic: dlqTopic, Origin: origin, Key: "large", Value: []byte(`{"payment":"large","pad":"` + string(make([]byte, 0)) + `xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`), Err: "boom"})
	ix := &Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: testenv.Group(t), Topics: []string{dlqTopic}, MaxValueBytes: 40}
	stop := runUntil(t, ix)
	failidxtest.WaitCount(t, pool, 2, `SELECT count(*) FROM idem_dlq_records`)
	stop()

	if err := k.Admin(t).DeleteRecords(dlqTopic, map[int32]int64{0: 2}); err != nil {
		t.Fatal(err)
	}
	if got := failidxtest.ReadAll(t, k, dlqTopic); len(got) != 0 {
		t.Fatalf("the DLQ topic still holds %d records", len(got))
	}
	s := failidx.NewStore(pool)
	small := mustList(t, s, failidx.Filter{Key: "small"})[0]
	r, err := s.Get(ctx, small.ID)
	if err != nil || string(r.Value) != `{"payment":"small"}` || r.Status != failidx.Unresolved {
		t.Fatalf("Get after the records expired: %q %s, %v", r.Value, r.Status, err)
	}
	large := mustList(t, s, failidx.Filter{Key: "large"})[0]
	a := failidx.NewActions(s, producerClient(t, k))
	res, err := a.Replay(ctx, "alice", failidx.Selection{IDs: []int64{small.ID, large.ID}}, "", 0, "after expiry")
	if err != nil || res.Done != 1 || len(res.Errors) != 1 {
		t.Fatalf("Replay = %+v, %v; want the small one replayed and an error for the truncated one", res, err)
	}
	got := failidxtest.ReadAll(t, k, origin)
	if len(got) != 1 || string(got[0].Value) != `{"payment":"small"}` {
		t.Fatalf("origin got %d records", len(got))
	}
	for id, want := range map[int64]failidx.Status{small.ID: failidx.Replayed, large.ID: failidx.Unresolved} {
		if r, err := s.Get(ctx, id); err != nil || r.Status != want {
			t.Errorf("record %d: %s, %v; want %s", id, r.Status, err, want)
		}
	}
}

package index_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/failidx"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// TestReplayFailsAgainLinksBack runs a consumer.Run whose handler always
// refuses key pay-1, and the indexer, on idemtest's broker and database.
// pay-1 is sent twice (two dead letters of one key); the first is replayed
// through the console's replay (failidx.Actions.Replay) and fails again:
// its new dead letter carries idem-replay-of naming the first, and its index
// row's PreviousID is the first's id, not the latest of the same key (the
// second). The second is then edited and retried; that fails too, and its
// dead letter keeps idem-replaces and idem-replay-of, and links back to the
// second.
func TestReplayFailsAgainLinksBack(t *testing.T) {
	k := idemtest.Connect(t)
	db := idemtest.ConnectPostgres(t) // idem's tables, the index's among them
	ctx := t.Context()
	source, group := k.Topic(t, "payments", 1), k.Group(t, "billing")
	dlqTopic := retrytopic.Policy{}.DLQ(source, group) // deleted with source

	for range 2 {
		k.Produce(t, source, idemtest.Record{IdempotencyKey: "pay-1", Key: []byte("pay-1"), Value: []byte(`{"id":"pay-1","amount":10}`)})
	}
	cfg := idemtest.WithPostgres(t, k.Config(t, group, source), db.Pool)
	idemtest.Start(t, cfg, handler.Func(func(context.Context, *handler.Message) error {
		return handler.Permanent(errors.New("ledger rejected payment: account frozen"))
	}))
	ix := &index.Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: db.Pool, Topics: []string{dlqTopic}, Group: k.Group(t, "indexer")}
	rctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := ix.Run(rctx); err != nil {
			t.Errorf("indexer: %v", err)
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })

	store := failidx.NewStore(db.Pool)
	// byOffset waits for n records of the DLQ topic in the index and returns
	// them by DLQ offset, with their headers.
	byOffset := func(n int) map[int64]failidx.Record {
		t.Helper()
		var out map[int64]failidx.Record
		idemtest.Eventually(t, 60*time.Second, func() error {
			page, err := store.List(ctx, failidx.Filter{Topic: dlqTopic}, "", 50)
			if err != nil {
				return err
			}
			if len(page.Records) != n {
				return fmt.Errorf("%d records indexed, want %d", len(page.Records), n)
			}
			out = map[int64]failidx.Record{}
			for _, r := range page.Records {
				if out[r.Offset], err = store.Get(ctx, r.ID); err != nil {
					return err
				}
			}
			return nil
		})
		return out
	}
	header := func(r failidx.Record, key string) string {
		v := ""
		for _, h := range r.Headers {
			if string(h.Key) == key {
				v = string(h.Value)
			}
		}
		return v
	}
	recs := byOffset(2)
	first, second := recs[0], recs[1]
	if second.PreviousID != first.ID {
		t.Fatalf("second failure of pay-1: PreviousID %d, want %d", second.PreviousID, first.ID)
	}

	client, err := sarama.NewClient(k.Brokers, failidx.ProducerConfig(k.SaramaConfig()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	acts := failidx.NewActions(store, client)
	res, err := acts.Replay(ctx, "tester", failidx.Selection{IDs: []int64{first.ID}}, "", 0, "ledger fixed")
	if err != nil || res.Done != 1 {
		t.Fatalf("Replay = %+v, %v", res, err)
	}
	again := byOffset(3)[2]
	if want := wire.ReplayOf(dlqTopic, 0, 0); header(again, wire.HeaderReplayOf) != want {
		t.Errorf("the replay's dead letter has %s = %q, want %q", wire.HeaderReplayOf, header(again, wire.HeaderReplayOf), want)
	}
	if again.PreviousID != first.ID {
		t.Errorf("the replay's dead letter: PreviousID %d, want the replayed record %d (not %d, the latest of its key)",
			again.PreviousID, first.ID, second.ID)
	}
	if again.IdempotencyKey != "pay-1" || again.Attempts < 1 {
		t.Errorf("the replay's dead letter: key %q attempts %d", again.IdempotencyKey, again.Attempts)
	}

	res, err = acts.EditAndRetry(ctx, "tester", second.ID, []byte(`{"id":"pay-1","amount":11}`), "amount corrected")
	if err != nil || res.Done != 1 {
		t.Fatalf("EditAndRetry = %+v, %v", res, err)
	}
	edited := byOffset(4)[3]
	want := wire.ReplayOf(dlqTopic, 0, 1)
	if header(edited, wire.HeaderReplayOf) != want || header(edited, "idem-replaces") != want {
		t.Errorf("the edit's dead letter has %s = %q and %s = %q, want %q for both", wire.HeaderReplayOf, header(edited, wire.HeaderReplayOf),
			"idem-replaces", header(edited, "idem-replaces"), want)
	}
	if edited.PreviousID != second.ID || string(edited.Value) != `{"id":"pay-1","amount":11}` {
		t.Errorf("the edit's dead letter: PreviousID %d value %s, want %d and the edited value", edited.PreviousID, edited.Value, second.ID)
	}
}

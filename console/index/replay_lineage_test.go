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
	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/indextable"
	"github.com/idemhq/idem/internal/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// TestReplayFailsAgainLinksBack runs a consumer.Run whose handler always
// refuses key pay-1, and the indexer. pay-1 is sent twice (two dead letters
// of one key); the first is replayed through Actions.Replay and fails again:
// its new dead letter carries idem-replay-of naming the first, and its index
// row's PreviousID is the first's id, not the latest of the same key (the
// second). The second is then edited and retried; that fails too, and its
// dead letter keeps idem-replaces and idem-replay-of, and links back to the
// second.
func TestReplayFailsAgainLinksBack(t *testing.T) {
	k := testenv.NewKafka(t)
	pool, _ := testenv.PostgresSchema(t)
	ctx := testenv.Context(t)
	if err := indextable.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	inbox := dedupe.NewPostgres(pool)
	if err := inbox.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	source, group := k.Topic(t, 1), testenv.Group(t)
	pol := retrytopic.Policy{}
	dlqTopic := pol.DLQ(source, group)
	t.Cleanup(func() { k.DeleteTopics(t, dlqTopic) })

	h := handler.Func(func(context.Context, *handler.Message) error {
		return handler.Permanent(errors.New("ledger rejected payment: account frozen"))
	})
	prod := k.Producer(t)
	for range 2 {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: source, Partition: 0, Key: sarama.StringEncoder("pay-1"),
			Value:   sarama.StringEncoder(`{"id":"pay-1","amount":10}`),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte("pay-1")}}}); err != nil {
			t.Fatal(err)
		}
	}
	rctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		err := consumer.Run(rctx, consumer.Config{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Group: group, Topics: []string{source},
			Dedupe: inbox, Retry: consumer.RetryConfig{Tiers: pol}, Retention: consumer.RetentionConfig{NoSweep: true}}, h)
		if err != nil {
			t.Errorf("consumer.Run: %v", err)
		}
	})
	ix := &index.Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Topics: []string{dlqTopic}, Group: testenv.Group(t)}
	wg.Go(func() {
		if err := ix.Run(rctx); err != nil {
			t.Errorf("indexer: %v", err)
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })

	store := index.NewStore(pool)
	// byOffset waits for n records of the DLQ topic in the index and returns
	// them by DLQ offset, with their headers.
	byOffset := func(n int) map[int64]index.Record {
		t.Helper()
		var out map[int64]index.Record
		testenv.Eventually(t, 60*time.Second, func() error {
			page, err := store.List(ctx, index.Filter{Topic: dlqTopic}, "", 50)
			if err != nil {
				return err
			}
			if len(page.Records) != n {
				return fmt.Errorf("%d records indexed, want %d", len(page.Records), n)
			}
			out = map[int64]index.Record{}
			for _, r := range page.Records {
				if out[r.Offset], err = store.Get(ctx, r.ID); err != nil {
					return err
				}
			}
			return nil
		})
		return out
	}
	header := func(r index.Record, key string) string {
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

	client, err := sarama.NewClient(k.Brokers, index.ProducerConfig(k.SaramaConfig()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	acts := index.NewActions(store, client)
	res, err := acts.Replay(ctx, "tester", index.Selection{IDs: []int64{first.ID}}, "", 0, "ledger fixed")
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

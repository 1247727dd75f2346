package main

import (
	"context"
	"fmt"
	"os/user"
	"strings"
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

// TestCLIActorBesideOSUser: --actor is free text, so the audit log records
// it beside the user the CLI runs as, never instead of it.
func TestCLIActorBesideOSUser(t *testing.T) {
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, topic, origin, 1)
	indexTopic(t, k, pg.Pool, topic, 1)
	code, _, _ := idem(t, k, "", "dlq", "resolve", "-t", topic, "--database-url", pg.URL, "--actor", "alice", "--reason", "done by hand")
	if code != 0 {
		t.Fatalf("resolve: code %d", code)
	}
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	var actor string
	if err := pg.Pool.QueryRow(context.Background(), `SELECT actor FROM idem_dlq_audit ORDER BY id DESC LIMIT 1`).Scan(&actor); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(actor, "alice") || !strings.Contains(actor, u.Username) {
		t.Errorf("audit actor %q, want alice beside the OS user %s", actor, u.Username)
	}
}

// TestCLIReplayWithAFailedRecordFails: a replay from the index in which a
// selected record could not be replayed (its value, truncated in the index,
// has been deleted from Kafka) exits non-zero, though others were sent.
func TestCLIReplayWithAFailedRecordFails(t *testing.T) {
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	for i, v := range []string{`{"order":0,"note":"long enough"}`, `{}`} {
		f := retrytopic.Failure{Attempt: 1, OriginalTopic: origin, OriginalOffset: int64(i), Group: "billing", Kind: handler.KindPermanent, Error: "boom",
			FirstFailureAt: time.Now(), LastFailureAt: time.Now()}
		hs := wire.Encode([]sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(fmt.Sprint("key-", i))}}, f)
		k.Produce(t, topic, idemtest.Record{Key: []byte(fmt.Sprint("k", i)), Value: []byte(v), Headers: kitHeaders(hs)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ix := &index.Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pg.Pool, Group: k.Group(t, "indexer"), Topics: []string{topic}, MaxValueBytes: 8}
	go func() { done <- ix.Run(ctx) }()
	idemtest.Eventually(t, 60*time.Second, func() error {
		var n int
		if err := pg.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_dlq_records`).Scan(&n); err != nil || n != 2 {
			return fmt.Errorf("%d indexed, %v", n, err)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Record 0's value is truncated in the index, and gone from Kafka.
	if err := admin(t, k).DeleteRecords(topic, map[int32]int64{0: 1}); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := idem(t, k, "", "dlq", "replay", "-t", topic, "--database-url", pg.URL)
	if code == 0 || !strings.Contains(out+errOut, "1 of 2") {
		t.Errorf("replay with a record that could not be replayed: code %d, want non-zero naming 1 of 2", code)
	}
	if got := readTopic(t, k, origin); len(got) != 1 {
		t.Errorf("origin holds %d records, want the one that could be replayed", len(got))
	}
}

// TestCLISaysWhichViewItShows: with DATABASE_URL set (as make services
// writes it) but no indexer run, the index holds nothing of a topic that
// has pending dead letters. idem dlq list says so with both counts and how
// to index them, and exits non-zero, instead of "0 records"; --from-topic
// shows the topic. Every answer names its view.
func TestCLISaysWhichViewItShows(t *testing.T) {
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, topic, origin, 3)
	code, out, errOut := idem(t, k, "", "dlq", "list", "-t", topic, "--database-url", pg.URL)
	if code == 0 || !strings.Contains(errOut, "3 pending") || !strings.Contains(errOut, "0 records") || !strings.Contains(errOut, "idem console") ||
		!strings.Contains(errOut, "--from-topic") {
		t.Errorf("list from an index that holds nothing of %s: code %d\nstdout:\n%s\nstderr:\n%s", topic, code, out, errOut)
	}
	code, out, _ = idem(t, k, "", "dlq", "list", "-t", topic, "--database-url", pg.URL, "--from-topic")
	if code != 0 || !strings.Contains(out, "view: topic") || !strings.Contains(out, "depth: 3 pending") {
		t.Errorf("list --from-topic: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "depth", "-t", topic)
	if code != 0 || !strings.Contains(out, "view: topic") {
		t.Errorf("depth: code %d\n%s", code, out)
	}
	indexTopic(t, k, pg.Pool, topic, 3)
	code, out, _ = idem(t, k, "", "dlq", "list", "-t", topic, "--database-url", pg.URL)
	if code != 0 || !strings.Contains(out, "view: failure index") || !strings.Contains(out, "3 records in the failure index") {
		t.Errorf("list from the index: code %d\n%s", code, out)
	}
}

// TestCLIReplayTargets: without a database too, a replay goes to each
// record's origin or one of its group's retry tiers: a foreign topic is
// refused before anything is read or sent, unless --replay-topic lists it.
func TestCLIReplayTargets(t *testing.T) {
	k := idemtest.Connect(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	foreign := k.Topic(t, "other-team", 1)
	seed(t, k, topic, origin, 2)
	code, _, errOut := idem(t, k, "", "dlq", "replay", "-t", topic, "--to", foreign)
	if code == 0 || !strings.Contains(errOut, "replay-topic") {
		t.Errorf("replay --to a foreign topic: code %d, want refused naming --replay-topic\n%s", code, errOut)
	}
	if got := readTopic(t, k, foreign); len(got) != 0 {
		t.Fatalf("the foreign topic got %d records", len(got))
	}
	tier := retrytopic.Policy{}.Tier(origin, "billing", 1)
	k.CreateTopic(t, tier, 1)
	t.Cleanup(func() { _ = admin(t, k).DeleteTopic(tier) })
	if code, out, _ := idem(t, k, "", "dlq", "replay", "-t", topic, "--to", tier, "--dry-run"); code != 0 {
		t.Errorf("replay --to the records' own tier: code %d\n%s", code, out)
	}
	if code, out, _ := idem(t, k, "", "dlq", "replay", "-t", topic, "--to", foreign, "--replay-topic", foreign); code != 0 || len(readTopic(t, k, foreign)) != 2 {
		t.Errorf("replay --to a listed topic: code %d\n%s", code, out)
	}
}

// TestCLIResumesAJob: a replay job whose process stopped (handed back, or
// dead) is listed by idem dlq jobs and resumed by --resume: each record is
// published once.
func TestCLIResumesAJob(t *testing.T) {
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, topic, origin, 3)
	indexTopic(t, k, pg.Pool, topic, 3)
	client, err := sarama.NewClient(k.Brokers, failidx.ProducerConfig(k.SaramaConfig()))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	f := failidx.Filter{Topic: topic}
	j, err := failidx.NewActions(failidx.NewStore(pg.Pool), client).StartReplay(t.Context(), "alice", failidx.Selection{Filter: &f}, "", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	// Its process stopped before it published anything.
	if _, err := pg.Pool.Exec(t.Context(), `UPDATE idem_dlq_jobs SET owner = NULL, heartbeat_at = NULL WHERE id = $1`, j.ID); err != nil {
		t.Fatal(err)
	}
	code, out, _ := idem(t, k, "", "dlq", "jobs", "--database-url", pg.URL)
	if code != 0 || !strings.Contains(out, fmt.Sprint(j.ID)) || !strings.Contains(out, "running") {
		t.Fatalf("jobs: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "jobs", "--database-url", pg.URL, "--resume")
	if code != 0 || !strings.Contains(out, "resumed job") {
		t.Fatalf("jobs --resume: code %d\n%s", code, out)
	}
	if got := readTopic(t, k, origin); len(got) != 3 {
		t.Errorf("origin holds %d records, want 3", len(got))
	}
}

package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemhq/idem/console/index"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/tables"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/retrytopic"
)

// indexTopic runs an indexer on topic until n records are in the index.
func indexTopic(t *testing.T, k *idemtest.Kafka, pool *pgxpool.Pool, topic string, n int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ix := &index.Indexer{Brokers: k.Brokers, Sarama: k.SaramaConfig(), Pool: pool, Group: k.Group(t, "indexer"), Topics: []string{topic}}
	go func() { done <- ix.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("indexer: %v", err)
		}
	}()
	idemtest.Eventually(t, 60*time.Second, func() error {
		var got int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_dlq_records`).Scan(&got); err != nil || got != n {
			return fmt.Errorf("%d indexed, %v", got, err)
		}
		return nil
	})
}

// schemaURL is the test database's URL with schema as its search_path, so the
// CLI sees the tables the test made.
func schemaURL(t *testing.T, schema string) string {
	t.Helper()
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// dlqAndEmptySchema returns a broker, an empty schema of the test's own (its
// pool and the --database-url that reaches it; internal/testing/testenv, as
// idemtest.ConnectPostgres would create idem's tables), an empty DLQ topic
// and its origin.
func dlqAndEmptySchema(t *testing.T) (k *idemtest.Kafka, pool *pgxpool.Pool, db, topic, origin string) {
	t.Helper()
	k = idemtest.Connect(t)
	pool, schema := testenv.PostgresSchema(t)
	return k, pool, schemaURL(t, schema), k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
}

// TestCLIIndexModel: with --database-url, the dlq commands work on the
// failure index: replaying 4 of 20 leaves the other 16 unresolved; a replay
// matching nothing exits 1; --dry-run and replay skip and report the stub;
// list and show mark it; archive needs a reason; every action is audited.
func TestCLIIndexModel(t *testing.T) {
	k, pool, db, topic, origin := dlqAndEmptySchema(t)
	seed(t, k, topic, origin, 20)
	seedStub(t, k, topic, origin, "big-1")
	// A database without the index is an error that names the way out; the
	// CLI creates nothing.
	code, _, errOut := idem(t, k, "", "dlq", "list", "-t", topic, "--database-url", db)
	if code != 1 || !strings.Contains(errOut, "no failure index") || !strings.Contains(errOut, `--database-url ""`) {
		t.Fatalf("list on a database without the index: code %d\n%s", code, errOut)
	}
	if err := tables.MigrateIndex(testenv.Context(t), pool); err != nil {
		t.Fatal(err)
	}
	indexTopic(t, k, pool, topic, 21)
	ids := func(where string) []string {
		rows, err := pool.Query(context.Background(), `SELECT id::text FROM idem_dlq_records WHERE `+where+` ORDER BY dlq_offset`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var s string
			_ = rows.Scan(&s)
			out = append(out, s)
		}
		return out
	}
	all, stub := ids("NOT stub"), ids("stub")[0]
	base := []string{"--database-url", db, "--actor", "alice"}
	dlqCmd := func(args ...string) []string { return append(append([]string{"dlq"}, args...), base...) }

	code, out, _ := idem(t, k, "", dlqCmd("list", "-t", topic)...)
	if code != 0 || !strings.Contains(out, "PARTITION/OFFSET") || !strings.Contains(out, "0/20") || !strings.Contains(out, "stub") ||
		!strings.Contains(out, "21 records in the failure index") {
		t.Fatalf("list: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", dlqCmd("show", "--id", stub)...)
	if code != 0 || !strings.Contains(out, "stub: value omitted") || !strings.Contains(out, "status:    unresolved") {
		t.Fatalf("show --id (stub): code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", dlqCmd("show", "-t", topic, "--offset", "3")...)
	if code != 0 || !strings.Contains(out, `"order": 3`) || !strings.Contains(out, "id:") {
		t.Fatalf("show --offset: code %d\n%s", code, out)
	}

	// Replay 4 of 20: the other 16 and the stub stay unresolved.
	code, out, _ = idem(t, k, "", dlqCmd("replay", "--id", all[0], "--id", all[5], "--id", all[10], "--id", all[15], "--reason", "ledger fixed")...)
	if code != 0 || !strings.Contains(out, "replayed 4 of 4 selected records to source") {
		t.Fatalf("replay --id: code %d\n%s", code, out)
	}
	if got := len(ids("status = 'unresolved'")); got != 17 {
		t.Fatalf("%d unresolved after replaying 4 of 21, want 17", got)
	}
	if got := readTopic(t, k, origin); len(got) != 4 {
		t.Fatalf("origin has %d records, want 4", len(got))
	}
	// Matching nothing exits 1.
	code, _, errOut = idem(t, k, "", dlqCmd("replay", "-t", topic, "--filter", "key=rf-4")...)
	if code != 1 || !strings.Contains(errOut, "nothing replayed") {
		t.Fatalf("replay matching nothing: code %d\n%s", code, errOut)
	}
	// The dry run reports the stub and sends nothing.
	code, out, _ = idem(t, k, "", dlqCmd("replay", "-t", topic, "--dry-run")...)
	if code != 0 || !strings.Contains(out, "would replay 16 of 17") || !strings.Contains(out, "1 stub would not be replayed") {
		t.Fatalf("replay --dry-run: code %d\n%s", code, out)
	}
	// The whole topic: 16 sent, the stub skipped and reported.
	code, out, _ = idem(t, k, "", dlqCmd("replay", "-t", topic, "--rate", "1000")...)
	if code != 0 || !strings.Contains(out, "replayed 16 of 17") || !strings.Contains(out, "1 stub never replayed") || !strings.Contains(out, "ids "+stub) {
		t.Fatalf("replay -t: code %d\n%s", code, out)
	}
	got := readTopic(t, k, origin)
	if len(got) != 20 {
		t.Fatalf("origin has %d records, want 20", len(got))
	}
	for _, m := range got {
		if len(m.Value) == 0 {
			t.Fatalf("an empty value was published (key %q)", m.Key)
		}
	}

	code, _, errOut = idem(t, k, "", dlqCmd("archive", "--id", stub)...)
	if code != 1 || !strings.Contains(errOut, "reason") {
		t.Fatalf("archive without a reason: code %d\n%s", code, errOut)
	}
	code, out, _ = idem(t, k, "", dlqCmd("archive", "--id", stub, "--reason", "payload too large for any topic")...)
	if code != 0 || !strings.Contains(out, "archived 1 of 1") {
		t.Fatalf("archive: code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", dlqCmd("resolve", "-t", topic, "--status", "replayed", "--reason", "verified")...)
	if code != 0 || !strings.Contains(out, "resolved 20 of 20") {
		t.Fatalf("resolve: code %d\n%s", code, out)
	}
	var audits int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_dlq_audit WHERE actor LIKE 'alice (os user %)'`).Scan(&audits); err != nil || audits != 6 {
		t.Fatalf("%d audit rows by alice, want 6 (3 replays, 2 archives, 1 resolve): %v", audits, err)
	}
}

// TestCLIDerivedKey: without a database, show --key and --filter key= match
// the idempotency key the consumer derived (header idem-idempotency-key),
// for a record whose key came from its body.
func TestCLIDerivedKey(t *testing.T) {
	k := idemtest.Connect(t)
	topic, origin := k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, topic, origin, 2)
	f := retrytopic.Failure{Attempt: 1, OriginalTopic: origin, Group: "billing", Kind: handler.KindPermanent, Error: "bad amount"}
	hs := wire.Encode([]sarama.RecordHeader(nil), f)
	hs = append(hs, sarama.RecordHeader{Key: []byte("idem-idempotency-key"), Value: []byte("pay-77")})
	k.Produce(t, topic, idemtest.Record{Key: []byte("customer-9"), Value: []byte(`{"payment_id":"pay-77"}`), Headers: kitHeaders(hs)})
	code, out, _ := idem(t, k, "", "dlq", "show", "-t", topic, "--key", "pay-77")
	if code != 0 || !strings.Contains(out, `"payment_id": "pay-77"`) {
		t.Fatalf("show --key (derived): code %d\n%s", code, out)
	}
	code, out, _ = idem(t, k, "", "dlq", "replay", "-t", topic, "--filter", "key=pay-77", "--dry-run")
	if code != 0 || !strings.Contains(out, "would replay 1 of 3") {
		t.Fatalf("replay --filter key= (derived): code %d\n%s", code, out)
	}
}

// TestCLIIndexReplayRate: with a database, replay paces at whole records a
// second (the index's Actions take an integer rate), so a fraction such as
// --rate 0.5 is refused, not truncated to 0, which means no cap at all; and
// nothing is sent or changed.
func TestCLIIndexReplayRate(t *testing.T) {
	k := idemtest.Connect(t)
	pg := idemtest.ConnectPostgres(t) // idem's tables, the index's among them
	pool, db, topic, origin := pg.Pool, pg.URL, k.Topic(t, "dlq", 1), k.Topic(t, "origin", 1)
	seed(t, k, topic, origin, 2)
	indexTopic(t, k, pool, topic, 2)
	for _, rate := range []string{"0.5", "2.5"} {
		code, _, errOut := idem(t, k, "", "dlq", "replay", "-t", topic, "--rate", rate, "--database-url", db)
		if code != 1 || !strings.Contains(errOut, "--rate "+rate) {
			t.Errorf("replay --rate %s with a database: code %d, want 1 naming --rate\n%s", rate, code, errOut)
		}
	}
	var unresolved int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_dlq_records WHERE status = 'unresolved'`).Scan(&unresolved); err != nil || unresolved != 2 {
		t.Errorf("%d records unresolved (%v), want 2", unresolved, err)
	}
	client, err := sarama.NewClient(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if end, err := client.GetOffset(origin, 0, sarama.OffsetNewest); err != nil || end != 0 {
		t.Errorf("the origin topic holds %d records (%v), want none", end, err)
	}
}

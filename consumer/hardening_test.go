package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/consumer"
	"github.com/idemhq/idem/dedupe"
	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/internal/testenv"
)

// hardRecord is one record of the hardening tests: a JSON value whose "op"
// tells hardHandler what to do, an optional idempotency-key header, and an
// optional "id" JSON field used as the key when the header is absent.
type hardRecord struct {
	header []byte // idempotency-key header value; nil: no header
	id     string // JSON "id"
	op     string // "ok", "bad-int" (SQLSTATE 22P02), "deferred" (fails at COMMIT), "kill" (terminates its backend), "reject" (permanent)
	pad    int    // bytes of padding in the value
}

func (e *env) produceHard(recs []hardRecord) {
	e.t.Helper()
	p := e.bigProducer()
	for _, r := range recs {
		v, _ := json.Marshal(map[string]string{"id": r.id, "op": r.op, "pad": strings.Repeat("x", r.pad)})
		m := &sarama.ProducerMessage{Topic: e.topic, Partition: 0, Key: sarama.StringEncoder("k"), Value: sarama.ByteEncoder(v)}
		if r.header != nil {
			m.Headers = []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: r.header}}
		}
		if _, _, err := p.SendMessage(m); err != nil {
			e.t.Fatalf("produce: %v", err)
		}
	}
}

// hardKey reads the idempotency-key header, or else the JSON "id" field, byte
// for byte (a NUL in the JSON string stays a NUL).
func hardKey(m *handler.Message) (string, error) {
	if v, ok := m.Header("idempotency-key"); ok {
		return string(v), nil
	}
	var v struct{ ID string }
	if err := json.Unmarshal(m.Value, &v); err != nil {
		return "", err
	}
	return v.ID, nil
}

// hardHandler applies "ok" records as one effects row and misbehaves as the
// record's op says.
func hardHandler(kill func() bool) handler.Func {
	return func(ctx context.Context, m *handler.Message) error {
		var v struct{ Op string }
		if err := json.Unmarshal(m.Value, &v); err != nil {
			return handler.Decode(err)
		}
		tx := dedupe.Tx(ctx)
		switch v.Op {
		case "bad-int":
			_, err := tx.Exec(ctx, `SELECT 'not a number'::int`)
			return err
		case "deferred":
			// Violates a deferred constraint: every statement succeeds, COMMIT fails (23505).
			if _, err := tx.Exec(ctx, `INSERT INTO deferred_uniq(v) VALUES (1), (1)`); err != nil {
				return err
			}
		case "reject":
			return handler.Permanent(errors.New("rejected"))
		case "kill":
			if kill() {
				// The database goes away under the handler (57P01 admin_shutdown).
				_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO effects(key, topic, part, off) VALUES ($1,$2,$3,$4)`, m.IdempotencyKey, m.Topic, m.Partition, m.Offset)
		return err
	}
}

// TestBadRecordsNeverStallAPartition: one partition, in order, a good record,
// then records each of which used to stop the partition or burn its retries
// on the wrong thing, then a good record. The last good record is applied,
// every bad one is in the DLQ with its kind, nothing is applied twice.
func TestBadRecordsNeverStallAPartition(t *testing.T) {
	e := newEnv(t, 1)
	ctx := testenv.Context(t)
	if _, err := e.pool.Exec(ctx, `CREATE TABLE deferred_uniq(v int, CONSTRAINT u UNIQUE (v) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	fourMiB := strconv.Itoa(4 << 20)
	if err := e.k.Admin(t).AlterConfig(sarama.TopicResource, e.topic, map[string]*string{"max.message.bytes": &fourMiB}, false); err != nil {
		t.Fatal(err)
	}
	e.produceHard([]hardRecord{
		{header: []byte("good-1"), op: "ok"},
		{header: []byte("bad-\xff\xfe-utf8"), op: "ok"},
		{id: "nul\x00inside", op: "ok"},
		{header: []byte("sqlstate-22P02"), op: "bad-int"},
		{header: []byte("deferred-23505"), op: "deferred"},
		{header: []byte("big-1.5MB"), op: "reject", pad: 1536 << 10},
		{header: []byte("good-2"), op: "ok"},
	})
	cfg := e.config()
	cfg.KeyFunc = hardKey
	start(t, cfg, hardHandler(func() bool { return false }))

	dlq := e.topic + "." + e.group + ".dlq"
	recs := e.coreReadRecords(dlq, 0, 5, 60*time.Second)
	sortByOrigin(recs) // lanes may dead-letter them in another order
	want := []struct{ offset, kind string }{{"1", "invalid-key"}, {"2", "invalid-key"}, {"3", "permanent"}, {"4", "retriable"}, {"5", "permanent"}}
	for i, w := range want {
		off, _ := coreHeader(recs[i], "idem-original-offset")
		kind, _ := coreHeader(recs[i], "idem-error-kind")
		if off != w.offset || kind != w.kind {
			msg, _ := coreHeader(recs[i], "idem-error")
			t.Errorf("DLQ record %d: offset %s kind %s (%s); want offset %s kind %s", i, off, kind, msg, w.offset, w.kind)
		}
	}
	if msg, _ := coreHeader(recs[3], "idem-error"); !strings.Contains(msg, "23505") {
		t.Errorf("deferred-constraint record's error %q does not name SQLSTATE 23505", msg)
	}
	if n := len(recs[4].Value); n < 1536<<10 {
		t.Errorf("the 1.5 MB record reached the DLQ with %d bytes of value, want it whole", n)
	}
	e.waitCommitted(e.topic, 1, 30*time.Second)
	if n := e.count(`SELECT count(*) FROM effects`); n != 2 {
		t.Errorf("effects: %d rows, want 2 (good-1, good-2)", n)
	}
	if n := e.count(`SELECT count(DISTINCT key) FROM effects WHERE key IN ('good-1','good-2')`); n != 2 {
		t.Errorf("good records applied: %d of 2", n)
	}
	// A database data error is not an outage: no store errors were counted.
	if n := metricValue(t, e, "idem_store_errors_total", nil); n != 0 {
		t.Errorf("idem_store_errors_total = %v, want 0 (no outage happened)", n)
	}
}

// TestDatabaseGoneUnderHandlerIsAnOutage: a handler whose connection is
// terminated (57P01) waits as in an outage — no retry budget spent, nothing
// dead-lettered — and the partition's stall shows in
// idem_partition_stalled_seconds until the message goes through.
func TestDatabaseGoneUnderHandlerIsAnOutage(t *testing.T) {
	e := newEnv(t, 1)
	var kills atomic.Int32
	release := make(chan struct{})
	kill := func() bool {
		if kills.Add(1) <= 3 {
			return true
		}
		<-release // stay stalled until the test has seen the gauge
		return false
	}
	e.produceHard([]hardRecord{{header: []byte("blip"), op: "kill"}, {header: []byte("after"), op: "ok"}})
	cfg := e.config()
	cfg.StallWarning = 200 * time.Millisecond
	cfg.OutageBackoff = 100 * time.Millisecond
	start(t, cfg, hardHandler(kill))

	labels := map[string]string{"topic": e.topic, "partition": "0"}
	testenv.Eventually(t, 30*time.Second, func() error {
		if v := metricValue(t, e, "idem_partition_stalled_seconds", labels); v <= 0 {
			return fmt.Errorf("idem_partition_stalled_seconds = %v after %d kills", v, kills.Load())
		}
		return nil
	})
	close(release)
	e.waitCommitted(e.topic, 1, 30*time.Second)
	if n := e.count(`SELECT count(*) FROM effects WHERE key IN ('blip','after')`); n != 2 {
		t.Errorf("effects: %d, want 2", n)
	}
	if n := metricValue(t, e, "idem_retries_total", nil); n != 0 {
		t.Errorf("idem_retries_total = %v, want 0: an outage spends no retry budget", n)
	}
	if n := metricValue(t, e, "idem_store_errors_total", nil); n < 3 {
		t.Errorf("idem_store_errors_total = %v, want >= 3", n)
	}
	if n := metricValue(t, e, "idem_messages_total", map[string]string{"outcome": "dead_lettered"}); n != 0 {
		t.Errorf("dead-lettered %v, want 0", n)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if v := metricValue(t, e, "idem_partition_stalled_seconds", labels); v != 0 {
			return fmt.Errorf("idem_partition_stalled_seconds = %v after the message went through", v)
		}
		return nil
	})
}

// TestHandlerThatAlwaysKillsItsConnectionEndsInDLQ: a record whose handling
// terminates the database connection every time, while the store itself
// works, is the record's fault: after a few outage tries it takes the
// handler-failure path (retries, then the DLQ) and the partition moves on.
func TestHandlerThatAlwaysKillsItsConnectionEndsInDLQ(t *testing.T) {
	e := newEnv(t, 1)
	e.produceHard([]hardRecord{{header: []byte("poison"), op: "kill"}, {header: []byte("after"), op: "ok"}})
	cfg := e.config()
	cfg.OutageBackoff = 50 * time.Millisecond
	start(t, cfg, hardHandler(func() bool { return true }))
	recs := e.coreReadRecords(e.topic+"."+e.group+".dlq", 0, 1, 60*time.Second)
	if key, _ := coreHeader(recs[0], "idempotency-key"); key != "poison" {
		t.Errorf("DLQ record key %q, want poison", key)
	}
	e.waitCommitted(e.topic, 1, 30*time.Second)
	if n := e.count(`SELECT count(*) FROM effects WHERE key = 'after'`); n != 1 {
		t.Errorf("the next record applied %d times, want 1", n)
	}
}

// TestAbortedTransactionsAreNeverHandled: records a transactional producer
// wrote and then aborted are not handled (read_committed is the default).
func TestAbortedTransactionsAreNeverHandled(t *testing.T) {
	e := newEnv(t, 1)
	pcfg := e.k.Config()
	pcfg.Producer.Idempotent = true
	pcfg.Producer.RequiredAcks = sarama.WaitForAll
	pcfg.Producer.Return.Successes = true
	pcfg.Producer.Transaction.ID = testenv.Unique("tx")
	pcfg.Producer.Partitioner = sarama.NewManualPartitioner
	pcfg.Net.MaxOpenRequests = 1
	p, err := sarama.NewSyncProducer(e.k.Brokers, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	send := func(key string) {
		t.Helper()
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder(`{"op":"ok"}`),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(key)}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		keys   []string
		commit bool
	}{{[]string{"aborted-1", "aborted-2"}, false}, {[]string{"committed"}, true}} {
		if err := p.BeginTxn(); err != nil {
			t.Fatal(err)
		}
		for _, k := range step.keys {
			send(k)
		}
		if step.commit {
			err = p.CommitTxn()
		} else {
			err = p.AbortTxn()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	start(t, e.config(), hardHandler(func() bool { return false }))
	// The committed record follows the aborted ones in the partition: once it
	// is applied, they were skipped. (The end offset counts the transaction
	// markers, which a consumer never receives, so it is not waited for.)
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := e.count(`SELECT count(*) FROM effects WHERE key = 'committed'`); n != 1 {
			return fmt.Errorf("committed record applied %d times, want 1", n)
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'aborted-%'`); n != 0 {
		t.Errorf("aborted records applied %d times, want 0", n)
	}
}

// sortByOrigin orders forwarded records by their idem-original-offset.
func sortByOrigin(recs []*sarama.ConsumerMessage) {
	off := func(m *sarama.ConsumerMessage) int64 {
		v, _ := coreHeader(m, "idem-original-offset")
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	sort.SliceStable(recs, func(i, j int) bool { return off(recs[i]) < off(recs[j]) })
}

// TestInboxRetentionShorterThanTopicWarns: an inbox that forgets keys
// sooner than the topic keeps records is named at start, with both numbers.
func TestInboxRetentionShorterThanTopicWarns(t *testing.T) {
	e := newEnv(t, 1)
	twoDays := strconv.Itoa(int((48 * time.Hour).Milliseconds()))
	if err := e.k.Admin(t).AlterConfig(sarama.TopicResource, e.topic, map[string]*string{"retention.ms": &twoDays}, false); err != nil {
		t.Fatal(err)
	}
	var logs logBuffer
	cfg := e.config()
	cfg.InboxRetention = time.Hour
	cfg.Retention = -1 // swept elsewhere: InboxRetention says for how long
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e.produce([]string{"k"}, 1)
	start(t, cfg, effectHandler())
	e.waitCommitted(e.topic, 1, 60*time.Second)
	out := logs.String()
	if !strings.Contains(out, "inbox forgets keys sooner") || !strings.Contains(out, "inbox_retention=1h0m0s") || !strings.Contains(out, "topic_retention=48h0m0s") {
		t.Errorf("no retention warning naming both numbers; logs:\n%s", out)
	}
}

// TestStartAtNewestSkipsTheBacklog: a new group with StartAt: StartNewest
// handles only records produced after it joined.
func TestStartAtNewestSkipsTheBacklog(t *testing.T) {
	e := newEnv(t, 1)
	e.produce([]string{"old-1", "old-2"}, 1)
	cfg := e.config()
	cfg.StartAt = consumer.StartNewest
	start(t, cfg, effectHandler())
	testenv.Eventually(t, 60*time.Second, func() error {
		if n := metricValue(t, e, "idem_partitions_assigned", nil); n != 1 {
			return fmt.Errorf("%v partitions claimed", n)
		}
		return nil
	})
	// The claim starts at the end offset it resolved on joining; produce
	// until a new record is handled (the first may race the claim's start).
	p := e.k.Producer(t)
	testenv.Eventually(t, 60*time.Second, func() error {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: e.topic, Partition: 0, Value: sarama.StringEncoder("{}"),
			Headers: []sarama.RecordHeader{{Key: []byte("idempotency-key"), Value: []byte(testenv.Unique("new"))}}}); err != nil {
			return err
		}
		if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'new%'`); n == 0 {
			return errors.New("no new record handled yet")
		}
		return nil
	})
	if n := e.count(`SELECT count(*) FROM effects WHERE key LIKE 'old-%'`); n != 0 {
		t.Errorf("%d records of the backlog handled with StartAt newest", n)
	}
}

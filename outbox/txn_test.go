package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/outbox"
)

// txnRelay is e.relay with ExactlyOnce and small rounds, so a test has many.
func (e *env) txnRelay() (*outbox.Relay, *prometheus.Registry) {
	r, reg := e.relay(e.pool)
	r.ExactlyOnce = true
	r.BatchSize = 20
	return r, reg
}

// enqueueKeyed commits n rows over keys k0…k(keys-1), value "<key>/<seq>"
// with seq counting from first, in transactions of 50.
func (e *env) enqueueKeyed(first, n, keys int) {
	e.t.Helper()
	var msgs []outbox.Message
	for i := range n {
		k := "k" + strconv.Itoa(i%keys)
		msgs = append(msgs, e.msg(k, k+"/"+strconv.Itoa(first+i/keys)))
		if len(msgs) == 50 || i == n-1 {
			e.enqueue(msgs...)
			msgs = nil
		}
	}
}

const sentinelKey = "idem-test-sentinel"

// settled waits until recs (of e.topic) has read everything the topic held
// when settled was called: it appends a sentinel record to every partition
// (outside any transaction) and waits for each, which a read_committed
// reader only gets past every earlier transaction's end. It returns the
// records before the sentinels.
func (e *env) settled(recs *records, topic string) []*sarama.ConsumerMessage {
	e.t.Helper()
	parts, err := e.admin().DescribeTopics([]string{topic})
	if err != nil {
		e.t.Fatal(err)
	}
	n := len(parts[0].Partitions)
	for i := range n {
		e.k.Produce(e.t, topic, idemtest.Record{Partition: int32(i), Key: []byte(sentinelKey), Value: []byte(strconv.Itoa(i))})
	}
	idemtest.Eventually(e.t, 60*time.Second, func() error {
		if got := len(recs.values(sentinelKey)); got < n {
			return fmt.Errorf("%d of %d sentinels read", got, n)
		}
		return nil
	})
	var out []*sarama.ConsumerMessage
	for _, m := range recs.snapshot() {
		if string(m.Key) != sentinelKey {
			out = append(out, m)
		}
	}
	return out
}

// exactlyOnce checks that msgs hold want distinct events (by idem-outbox-id),
// each once, and that every key's values come in enqueue order.
func exactlyOnce(t *testing.T, msgs []*sarama.ConsumerMessage, want int) {
	t.Helper()
	copies := map[string]int{}
	last := map[string]int{}
	for _, m := range msgs {
		id := outboxstore.HeaderID
		copies[header(m, id)]++
		if c := copies[header(m, id)]; c > 1 {
			t.Errorf("event %s (%s) read %d times by a read_committed reader", header(m, id), m.Value, c)
		}
		k, seq, ok := strings.Cut(string(m.Value), "/")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(seq)
		if prev, seen := last[k]; seen && n <= prev {
			t.Errorf("key %s: %d after %d (out of order)", k, n, prev)
		}
		last[k] = n
	}
	if len(copies) != want {
		t.Fatalf("%d distinct events read, want %d (lost %d)", len(copies), want, want-len(copies))
	}
	if len(msgs) != want {
		t.Fatalf("%d records for %d events", len(msgs), want)
	}
}

// noOpenTransaction waits until the relay's transactional id has no
// transaction open or being completed (none left hanging).
func (e *env) noOpenTransaction() {
	e.t.Helper()
	ctx := e.t.Context()
	id, err := outbox.DefaultTransactionalID(ctx, e.pool, "")
	if err != nil {
		e.t.Fatal(err)
	}
	admin, ok := e.admin().(sarama.TransactionClusterAdmin)
	if !ok {
		e.t.Fatal("sarama's cluster admin has no DescribeTransactions")
	}
	idemtest.Eventually(e.t, 30*time.Second, func() error {
		states, err := admin.DescribeTransactions([]string{id})
		if err != nil {
			return err
		}
		switch st := states[id].TransactionState; st {
		case "Ongoing", "PrepareCommit", "PrepareAbort":
			return fmt.Errorf("transactional id %s: %s", id, st)
		}
		return nil
	})
}

// waitEmpty waits until the outbox table has no row.
func (e *env) waitEmpty(timeout time.Duration) {
	e.t.Helper()
	e.waitCount(timeout, 0, "true")
}

// waitCount waits until want rows of the outbox table match where.
func (e *env) waitCount(timeout time.Duration, want int, where string) {
	e.t.Helper()
	idemtest.Eventually(e.t, timeout, func() error {
		if n := e.count(where); n != want {
			return fmt.Errorf("%d rows WHERE %s, want %d", n, where, want)
		}
		return nil
	})
}

// TestExactlyOncePublishes: with ExactlyOnce the relay publishes every row
// once, in key order, deletes it, and a restarted relay finds the mark and
// sends nothing again.
func TestExactlyOncePublishes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	committed := e.consumeAt(e.topic, sarama.ReadCommitted)
	e.enqueueKeyed(0, 300, 10)
	r, _ := e.txnRelay()
	stop := start(t, r)
	e.waitEmpty(60 * time.Second)
	stop()
	e.enqueueKeyed(30, 20, 10)
	r2, _ := e.txnRelay()
	start(t, r2)
	e.waitEmpty(60 * time.Second)
	exactlyOnce(t, e.settled(committed, e.topic), 320)
}

// TestExactlyOnceKeepPublished: with KeepPublished the exactly-once relay
// marks each committed round's rows published instead of deleting them, and
// a restarted relay does not send them again.
func TestExactlyOnceKeepPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	committed := e.consumeAt(e.topic, sarama.ReadCommitted)
	e.enqueueKeyed(0, 60, 6)
	r, _ := e.txnRelay()
	r.KeepPublished = time.Hour
	stop := start(t, r)
	e.waitCount(60*time.Second, 60, "state = 'published'")
	stop()
	r2, _ := e.txnRelay()
	r2.KeepPublished = time.Hour
	start(t, r2)
	e.enqueueKeyed(10, 6, 6)
	e.waitCount(60*time.Second, 66, "state = 'published'")
	exactlyOnce(t, e.settled(committed, e.topic), 66)
}

// The crash test's child process: env childTxnEnv names the schema, and
// childKillAt where the child stops and waits for its SIGKILL: "commit"
// (after CommitTxn, before the rows are deleted), "produce" (records
// produced, before the commit) or "" (nowhere: the parent kills it while it
// runs). It prints markerCommitted after each committed round.
const (
	childTxnEnv     = "IDEM_OUTBOX_TXN_CHILD"
	childKillAt     = "IDEM_OUTBOX_TXN_KILL_AT"
	markerCommitted = "IDEM-OUTBOX-TXN-COMMITTED"
	markerWaiting   = "IDEM-OUTBOX-TXN-WAITING"
)

// TestExactlyOnceRelayChildProcess is the relay the SIGKILL test runs in a
// child process; it does nothing in a normal run.
func TestExactlyOnceRelayChildProcess(t *testing.T) {
	e := childEnvOf(t, childTxnEnv)
	if e == nil {
		return
	}
	r, _ := e.txnRelay()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	at := os.Getenv(childKillAt)
	outbox.SetBeforeCommit(r, func(round int64) error {
		if at == "produce" {
			fmt.Printf("\n%s produce %d\n", markerWaiting, round)
			<-ctx.Done()
		}
		return nil
	})
	outbox.SetAfterCommit(r, func(round int64, err error) {
		if err != nil {
			return
		}
		fmt.Printf("\n%s %d\n", markerCommitted, round)
		if at == "commit" {
			fmt.Printf("\n%s commit %d\n", markerWaiting, round)
			<-ctx.Done()
		}
	})
	_ = r.Run(ctx)
	t.Fatal("the child was not killed within two minutes")
}

// TestExactlyOnceSurvivesSIGKILL: a child process running the exactly-once
// relay is SIGKILLed again and again: after a commit and before its rows
// are deleted, after producing and before the commit, and at random points
// while it runs; each time a new child takes over. Once the outbox is empty,
// a read_committed reader has every event exactly once, in key order.
func TestExactlyOnceSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	committed := e.consumeAt(e.topic, sarama.ReadCommitted)
	uncommitted := e.consume(e.topic)
	const rows = 600
	e.enqueueKeyed(0, rows, 30)

	plan := []string{"commit", "random", "produce", "random", "commit", "random", "produce", "random", "commit"}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	kills := 0
	for i, at := range plan {
		left := e.count("true")
		if left == 0 {
			break
		}
		point := at
		if at == "random" {
			point = ""
		}
		out := e.runTxnChild(point, 1+rng.IntN(3), time.Duration(rng.IntN(50))*time.Millisecond)
		kills++
		t.Logf("kill %d (%s): %s; %d rows left before, %d after", i+1, at, out, left, e.count("true"))
		if at == "commit" {
			// The committed round's rows are still in the table: the next
			// leader must delete them, not send them again.
			if n := e.count("id IN (SELECT unnest(ids) FROM idem_outbox_rounds)"); n == 0 {
				t.Fatalf("killed between commit and delete, but no row of a recorded round is left")
			}
		}
	}
	if kills < 6 {
		t.Fatalf("only %d kills before the outbox emptied; enqueue more rows", kills)
	}
	// The last leader runs to the end, and stops cleanly.
	r2, _ := e.txnRelay()
	stop := start(t, r2)
	e.waitEmpty(2 * time.Minute)
	stop()
	e.noOpenTransaction()
	got := e.settled(committed, e.topic)
	exactlyOnce(t, got, rows)
	t.Logf("%d kills; read_committed: %d records for %d events; read_uncommitted: %d records (aborted copies included)",
		kills, len(got), rows, len(uncommitted.snapshot())-3)
}

// runTxnChild starts a child relay that stops at point ("commit",
// "produce") and SIGKILLs it there, or, for "", SIGKILLs it jitter after it
// reported its rounds-th commit, wherever it then is (deleting, reading,
// recording a round, producing, committing); it waits for the child and returns what
// it reported last.
func (e *env) runTxnChild(point string, rounds int, jitter time.Duration) string {
	t := e.t
	t.Helper()
	c := e.startChild("TestExactlyOnceRelayChildProcess", childTxnEnv, childKillAt+"="+point)
	commits := 0
	what, ok := c.WaitFor(func(line string) bool {
		switch {
		case point != "":
			return strings.HasPrefix(line, markerWaiting)
		case strings.HasPrefix(line, markerCommitted):
			commits++
			return commits == rounds
		}
		return false
	})
	switch {
	case !ok:
		what = "exited or emptied the outbox before the kill point"
	case point == "":
		time.Sleep(jitter) // not synchronisation: where the kill lands in the child's next round
		what = fmt.Sprintf("running, after %d committed rounds + %s", rounds, jitter)
	}
	_ = c.Cmd.Process.Kill() // SIGKILL: no deferred code runs in the child
	_ = c.Wait()
	return what
}

// TestExactlyOnceFencesAZombie: relay A has produced a round and is about to
// commit it when it loses its database session; relay B takes over, its new
// producer fences A's, and B publishes the rows itself. When A then commits,
// Kafka refuses, and a read_committed reader sees every event once. A then
// recreates its producer (fencing B in turn) but cannot touch the table, and
// B recovers and publishes the rows enqueued afterwards, still once each.
func TestExactlyOnceFencesAZombie(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	committed := e.consumeAt(e.topic, sarama.ReadCommitted)
	e.enqueueKeyed(0, 40, 5)

	a, _ := e.txnRelay()
	holding, release := make(chan int64, 1), make(chan struct{})
	var once sync.Once
	outbox.SetBeforeCommit(a, func(round int64) error {
		once.Do(func() {
			holding <- round
			<-release
		})
		return nil
	})
	aCommit := make(chan error, 10)
	outbox.SetAfterCommit(a, func(_ int64, err error) { aCommit <- err })
	start(t, a)
	var round int64
	select {
	case round = <-holding:
	case <-time.After(time.Minute):
		t.Fatal("relay A never produced a round")
	}
	var releaseOnce sync.Once
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })

	b, _ := e.txnRelay()
	start(t, b)
	ctx := t.Context()
	var pid int32
	if err := e.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid::bigint = $1 AND objid = 'idem_outbox'::regclass::oid AND objsubid = 1`, 0x69646f78).Scan(&pid); err != nil {
		t.Fatalf("find A's session: %v", err)
	}
	if _, err := e.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	e.waitEmpty(60 * time.Second) // B published A's round (and the rest) and deleted the rows

	releaseOnce.Do(func() { close(release) })
	select {
	case err := <-aCommit:
		if err == nil {
			t.Fatalf("the zombie committed round %d after B took over", round)
		}
		t.Logf("zombie A's commit of round %d failed as it must: %v", round, err)
	case <-time.After(time.Minute):
		t.Fatal("A never tried to commit")
	}
	e.enqueueKeyed(8, 40, 5)
	e.waitEmpty(60 * time.Second)
	e.noOpenTransaction()
	got := e.settled(committed, e.topic)
	exactlyOnce(t, got, 80)
}

// TestExactlyOnceAbortsAndRetries: rounds that fail mid-way are aborted and
// their rows go out again in later rounds, once each for a read_committed
// reader: (1) the first three rounds fail after their records were produced
// and acked (a hook fails them before the commit); (2) a row too large for
// the topic makes the broker refuse its batch, and sarama fail the
// transaction (an abortable error): the round is aborted, each of its rows
// is then tried alone, and only that row counts rejections until it moves to
// the failed state; (3) a row too large for the producer and rows for a
// topic that does not exist yet stay out of the transactions (they would
// fail them): the first fails, the others wait, without holding other keys
// back, until the topic is created.
func TestExactlyOnceAbortsAndRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	committed := e.consumeAt(e.topic, sarama.ReadCommitted)
	uncommitted := e.consume(e.topic)
	missing := e.topic + ".missing" // created below, and deleted with the test's topic
	e.enqueueKeyed(0, 50, 10)
	maxBytes := "4096"
	if err := e.admin().AlterConfig(sarama.TopicResource, e.topic, map[string]*string{"max.message.bytes": &maxBytes}, false); err != nil {
		t.Fatal(err)
	}
	e.enqueue(outbox.Message{Topic: e.topic, Key: []byte("big"), Value: make([]byte, 2<<20)},
		outbox.Message{Topic: e.topic, Key: []byte("huge"), Value: make([]byte, 10_000)})
	for i := range 5 {
		e.enqueue(outbox.Message{Topic: missing, Key: []byte("m" + strconv.Itoa(i)), Value: []byte("m")})
	}
	e.enqueueKeyed(5, 50, 10)
	r, reg := e.txnRelay()
	r.MaxAttempts = 3
	var failedRounds atomic.Int32
	outbox.SetBeforeCommit(r, func(round int64) error {
		if failedRounds.Add(1) <= 3 {
			return errors.New("test: fail this round before its commit")
		}
		return nil
	})
	start(t, r)
	idemtest.Eventually(t, 60*time.Second, func() error {
		if n := e.count("topic = $1 AND state = 'pending'", e.topic); n != 0 {
			return fmt.Errorf("%d rows of %s pending", n, e.topic)
		}
		return nil
	})
	if n := e.count("key IN ('big', 'huge') AND state = 'failed' AND rejections = 3"); n != 2 {
		t.Fatalf("%d of the 2 oversized rows failed after 3 rejections", n)
	}
	if n := e.count("rejections > 0 AND key NOT IN ('big', 'huge')"); n != 0 {
		t.Fatalf("%d rows counted rejections that were not theirs", n)
	}
	if n := e.count("topic = $1 AND state = 'pending'", missing); n != 5 {
		t.Fatalf("%d rows for the missing topic pending, want all 5", n)
	}
	if f := metric(t, reg, "idem_outbox_publish_failures_total", "unknown_topic", "idem_outbox"); f == 0 {
		t.Fatal("no unknown_topic failure counted")
	}
	e.k.CreateTopic(t, missing, 1)
	idemtest.Eventually(t, 2*time.Minute, func() error {
		if n := e.count("state = 'pending'"); n != 0 {
			return fmt.Errorf("%d rows pending", n)
		}
		return nil
	})

	got := e.settled(committed, e.topic)
	exactlyOnce(t, got, 100)
	raw := len(uncommitted.snapshot()) - 3 // less the sentinels
	if raw <= 100 {
		t.Fatalf("read_uncommitted saw %d records: no aborted round reached the log, so nothing was tested", raw)
	}
	t.Logf("read_committed: 100 records; read_uncommitted: %d (copies in aborted rounds)", raw)
	m := e.consumeAt(missing, sarama.ReadCommitted)
	exactlyOnce(t, e.settled(m, missing), 5)
}

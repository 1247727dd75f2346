package outbox_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/handler"
	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/outboxstore"
	"github.com/idemhq/idem/outbox"
)

// TestRelayPublishesInOrderWithHeaders: committed rows reach Kafka with the
// event id as idem-outbox-id and idempotency-key (unless the caller set
// one), keys keep their order, and acked rows leave the table.
func TestRelayPublishesInOrderWithHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	recs := e.consume(e.topic)
	r, reg := e.relay(e.pool)
	start(t, r)
	for i := range 20 {
		m := e.msg("k"+strconv.Itoa(i%4), strconv.Itoa(i))
		m.Headers = []handler.Header{{Key: "event-type", Value: []byte("test")}}
		if i == 0 {
			m.Headers = append(m.Headers, handler.Header{Key: "idempotency-key", Value: []byte("mine")})
		}
		e.enqueue(m)
	}
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := len(recs.snapshot()); n < 20 {
			return fmt.Errorf("%d of 20 records", n)
		}
		return nil
	})
	for k := range 4 {
		got := recs.values("k" + strconv.Itoa(k))
		for j, v := range got {
			if want := strconv.Itoa(k + 4*j); v != want {
				t.Fatalf("key k%d: record %d is %s, want %s (all: %v)", k, j, v, want, got)
			}
		}
	}
	for _, m := range recs.snapshot() {
		id := header(m, outboxstore.HeaderID)
		if id == "" || header(m, "event-type") != "test" {
			t.Fatalf("record %s: headers %v", m.Value, m.Headers)
		}
		want := id
		if string(m.Value) == "0" {
			want = "mine"
		}
		if got := header(m, outbox.HeaderIdempotencyKey); got != want {
			t.Fatalf("record %s: idempotency-key %q, want %q", m.Value, got, want)
		}
	}
	idemtest.Eventually(t, 10*time.Second, func() error {
		if n := e.count("true"); n != 0 {
			return fmt.Errorf("%d rows left in the outbox", n)
		}
		if p := metric(t, reg, "idem_outbox_published_total", "idem_outbox"); p != 20 {
			return fmt.Errorf("idem_outbox_published_total = %v", p)
		}
		return nil
	})
	if n := metric(t, reg, "idem_outbox_publish_seconds", "idem_outbox"); n != 20 {
		t.Fatalf("idem_outbox_publish_seconds has %v samples, want 20", n)
	}
	if l := metric(t, reg, "idem_outbox_leader", "idem_outbox"); l != 1 {
		t.Fatalf("idem_outbox_leader = %v, want 1", l)
	}
}

// TestKeepPublishedMarksAndSweeps: with KeepPublished the acked rows stay as
// "published" and are swept after the retention, never the pending ones.
func TestKeepPublishedMarksAndSweeps(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.consume(e.topic)
	r, _ := e.relay(e.pool)
	r.KeepPublished = time.Hour
	r.SweepInterval = 50 * time.Millisecond
	start(t, r)
	e.enqueue(e.msg("a", "1"), e.msg("b", "2"))
	recs.waitKeys(t, "a", "b")
	idemtest.Eventually(t, 10*time.Second, func() error {
		if n := e.count("state = 'published' AND published_at IS NOT NULL"); n != 2 {
			return fmt.Errorf("%d published rows, want 2", n)
		}
		return nil
	})
	// Age one row past the retention: the sweep deletes it, not the recent
	// one, and never an unpublished row however old.
	ctx := t.Context()
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_outbox (topic, key, value, state, attempts, last_error, created_at, published_at)
		VALUES ('t', 'f', 'failed long ago', 'failed', 10, 'x', now() - interval '1 day', now() - interval '1 day')`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, "UPDATE idem_outbox SET published_at = now() - interval '2 hours' WHERE key = 'a'"); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 10*time.Second, func() error {
		if n := e.count("key = 'a'"); n != 0 {
			return fmt.Errorf("row a not swept yet")
		}
		return nil
	})
	if n := e.count("key = 'b' AND state = 'published'"); n != 1 {
		t.Fatalf("row b: %d, want it kept", n)
	}
	if n := e.count("key = 'f' AND state = 'failed'"); n != 1 {
		t.Fatalf("the failed row was swept")
	}
}

// TestLateCommitNotSkipped (issue test 4): a long transaction holds a lower
// id while later ones commit and are published; its row is published when
// it commits. Then many writers commit out of id order at once: every event
// arrives.
func TestLateCommitNotSkipped(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	recs := e.consume(e.topic)
	r, _ := e.relay(e.pool)
	start(t, r)
	ctx := t.Context()

	long, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer long.Rollback(ctx)
	if err := outbox.Enqueue(ctx, long, e.msg("late", "late")); err != nil {
		t.Fatal(err)
	}
	var lateID int64
	if err := long.QueryRow(ctx, "SELECT id FROM idem_outbox WHERE key = 'late'").Scan(&lateID); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for i := range 20 {
		keys = append(keys, "k"+strconv.Itoa(i))
		e.enqueue(e.msg(keys[i], strconv.Itoa(i)))
	}
	recs.waitKeys(t, keys...)
	var minOther int64
	// Everything committed after the long transaction drew a higher id.
	if err := long.QueryRow(ctx, "SELECT coalesce(min(id), 0) FROM idem_outbox WHERE key <> 'late'").Scan(&minOther); err != nil {
		t.Fatal(err)
	}
	if minOther != 0 && minOther < lateID {
		t.Fatalf("later rows have ids from %d, the late row %d: the race was not provoked", minOther, lateID)
	}
	if v := recs.values("late"); len(v) != 0 {
		t.Fatalf("uncommitted row published: %v", v)
	}
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	recs.waitKeys(t, "late")

	// Many writers, each holding its transaction open a random while after
	// its insert, so commits land out of id order all the time.
	const writers, each = 8, 40
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				key := fmt.Sprintf("w%d-%d", w, i)
				err := func() error {
					tx, err := e.pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx)
					if err := outbox.Enqueue(ctx, tx, e.msg(key, key)); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, "SELECT pg_sleep($1)", rand.Float64()*0.02); err != nil {
						return err
					}
					return tx.Commit(ctx)
				}()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []string
	for w := range writers {
		for i := range each {
			all = append(all, fmt.Sprintf("w%d-%d", w, i))
		}
	}
	recs.waitKeys(t, all...)
	idemtest.Eventually(t, 10*time.Second, func() error {
		if n := e.count("true"); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
}

// TestBadInputFailsWithoutBlockingOthers: a row Kafka refuses for itself
// (too large) fails after MaxAttempts refusals and stops holding back its
// key; a row whose topic does not exist is an outage, not bad input: it is
// retried without counting against the row, however often it fails (a
// credential rotation or a topic not created yet must not move every head
// row to failed), holds back its key's later rows, and is published, in
// order, once the topic exists. Other keys flow meanwhile.
func TestBadInputFailsWithoutBlockingOthers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	recs := e.consume(e.topic)
	r, reg := e.relay(e.pool)
	r.MaxAttempts = 3
	start(t, r)
	missing := e.topic + ".missing" // created below, and deleted with the test's topic

	big := e.msg("big", "")
	big.Value = make([]byte, 2<<20)
	e.enqueue(big, outbox.Message{Topic: missing, Key: []byte("late"), Value: []byte("1")}, e.msg("big", "after-big"),
		outbox.Message{Topic: missing, Key: []byte("late"), Value: []byte("2")})
	var ok []string
	for i := range 5 {
		ok = append(ok, "ok"+strconv.Itoa(i))
		e.enqueue(e.msg(ok[i], "fine"))
	}
	recs.waitKeys(t, ok...)
	idemtest.Eventually(t, 60*time.Second, func() error {
		if n := e.count("key = 'late' AND state <> 'pending'"); n != 0 {
			t.Fatalf("%d rows of a missing topic left the pending state: an outage counted as bad input", n)
		}
		if n := e.count("key = 'late' AND value = '1' AND attempts > 5"); n != 1 {
			return errors.New("the missing topic's head has not failed more than MaxAttempts times yet")
		}
		if n := e.count("state = 'failed'"); n != 1 {
			return fmt.Errorf("%d failed rows, want 1 (the oversized one)", n)
		}
		return nil
	})
	if n := e.count("key = 'late' AND rejections = 0 AND state = 'pending'"); n != 2 {
		t.Fatalf("%d of the missing topic's 2 rows pending with no rejection counted", n)
	}
	if n := e.count("key = 'big' AND state = 'failed' AND rejections = 3 AND attempts = 3 AND last_error <> ''"); n != 1 {
		t.Fatalf("the oversized row: %d failed with 3 rejections, want 1", n)
	}
	recs.waitKeys(t, "big")
	if v := recs.values("big"); len(v) != 1 || v[0] != "after-big" {
		t.Fatalf("key big published %d records, want only after-big", len(v))
	}
	if got := metric(t, reg, "idem_outbox_publish_failures_total", "too_large", "idem_outbox"); got != 3 {
		t.Fatalf("idem_outbox_publish_failures_total{reason=too_large} = %v, want 3", got)
	}
	// (sarama's producer reports some of them as "circuit breaker is open": reason other.)
	if got := metric(t, reg, "idem_outbox_publish_failures_total", "unknown_topic", "idem_outbox"); got < 1 {
		t.Fatalf("idem_outbox_publish_failures_total{reason=unknown_topic} = %v, want >= 1", got)
	}
	idemtest.Eventually(t, 10*time.Second, func() error {
		if f := metric(t, reg, "idem_outbox_failed", "idem_outbox"); f != 1 {
			return fmt.Errorf("idem_outbox_failed = %v", f)
		}
		return nil
	})
	failed, err := outbox.List(t.Context(), e.pool, outbox.ListOptions{State: outbox.StateFailed})
	if err != nil {
		t.Fatal(err)
	}
	if len(failed) != 1 || failed[0].Topic != e.topic || failed[0].ValueSize != 2<<20 || failed[0].Rejections != 3 {
		t.Fatalf("failed rows: %+v", failed)
	}

	// The topic appears: the waiting rows go out in order, with no Retry.
	e.k.CreateTopic(t, missing, 1)
	late := e.consume(missing)
	idemtest.Eventually(t, 60*time.Second, func() error {
		if v := late.values("late"); len(v) != 2 || v[0] != "1" || v[1] != "2" {
			return fmt.Errorf("records of late: %v, want [1 2]", v)
		}
		return nil
	})
	// Retry makes the oversized row pending again, its counts reset.
	done, err := outbox.Retry(t.Context(), e.pool, "", failed[0].ID, 999999)
	if err != nil || len(done) != 1 || done[0] != failed[0].ID {
		t.Fatalf("Retry = %v, %v; want [%d]", done, err, failed[0].ID)
	}
	idemtest.Eventually(t, 60*time.Second, func() error {
		if n := e.count("key = 'big' AND state = 'failed' AND rejections = 3"); n != 1 {
			return errors.New("the retried oversized row has not failed again")
		}
		return nil
	})
}

// TestFailedRowHoldsBackItsKey: while a row of key K keeps failing, the
// later rows of K wait and other keys are published; when the cause is
// fixed, K's rows go out in order.
func TestFailedRowHoldsBackItsKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	r, reg := e.relay(e.pool)
	r.MaxAttempts = 1000
	r.RetryBase, r.RetryMax = 200*time.Millisecond, 200*time.Millisecond
	start(t, r)
	missing := e.topic + ".missing" // created below, and deleted with the test's topic

	e.enqueue(outbox.Message{Topic: missing, Key: []byte("K"), Value: []byte("first")}, e.msg("K", "second"), e.msg("O", "other"))
	recs := e.consume(e.topic)
	recs.waitKeys(t, "O")
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := e.count("key = 'K' AND attempts >= 2"); n != 1 {
			return errors.New("K's head has not failed twice yet")
		}
		return nil
	})
	// A round after K's head failed: K's second row still waits.
	e.enqueue(e.msg("M", "marker"))
	recs.waitKeys(t, "M")
	if v := recs.values("K"); len(v) != 0 {
		t.Fatalf("K's later row passed its failing head: %v", v)
	}
	if n := e.count("key = 'K' AND value = 'second' AND attempts = 0 AND state = 'pending'"); n != 1 {
		t.Fatalf("K's second row: %d pending untried rows, want 1", n)
	}
	idemtest.Eventually(t, 10*time.Second, func() error {
		if p := metric(t, reg, "idem_outbox_pending", "idem_outbox"); p != 2 {
			return fmt.Errorf("idem_outbox_pending = %v, want 2", p)
		}
		if o := metric(t, reg, "idem_outbox_oldest_pending_seconds", "idem_outbox"); o <= 0 {
			return fmt.Errorf("idem_outbox_oldest_pending_seconds = %v, want > 0", o)
		}
		return nil
	})

	e.k.CreateTopic(t, missing, 1)
	first := e.consume(missing)
	first.waitKeys(t, "K")
	recs.waitKeys(t, "K")
	if v := recs.values("K"); len(v) != 1 || v[0] != "second" {
		t.Fatalf("K on %s: %v", e.topic, v)
	}
	// The head was acked before the second row was sent.
	if a, b := first.snapshot()[0].Timestamp, recs.snapshot()[len(recs.snapshot())-1].Timestamp; b.Before(a) {
		t.Fatalf("K's second row (%s) was published before its head (%s)", b, a)
	}
}

// TestEnqueueRejectsBadMessages: nothing is inserted for an invalid batch
// (no topic, a header with no name, a NotBefore outside PostgreSQL's
// timestamptz range).
func TestEnqueueRejectsBadMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := t.Context()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, m := range []outbox.Message{{Key: []byte("no topic")}, {Topic: "x", Headers: []handler.Header{{Value: []byte("v")}}},
		{Topic: "x", NotBefore: time.Date(300000, 1, 1, 0, 0, 0, 0, time.UTC)},
		{Topic: "x", NotBefore: time.Date(-5000, 1, 1, 0, 0, 0, 0, time.UTC)}} {
		if err := outbox.Enqueue(ctx, tx, e.msg("fine", "1"), m); !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Fatalf("Enqueue(%+v) = %v, want ErrInvalidMessage", m, err)
		}
	}
	if err := outbox.Enqueue(ctx, nil, e.msg("a", "b")); !errors.Is(err, outbox.ErrInvalidMessage) {
		t.Fatalf("Enqueue(nil tx) = %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count("true"); n != 0 {
		t.Fatalf("%d rows inserted", n)
	}
	if err := (&outbox.Relay{}).Validate(); !errors.Is(err, outbox.ErrInvalidConfig) {
		t.Fatalf("Validate of an empty Relay = %v", err)
	}
}

// TestRelayValidate: bad fields are named.
func TestRelayValidate(t *testing.T) {
	t.Parallel()
	pool := idemtest.ConnectPostgres(t).Pool
	for _, c := range []struct {
		r    outbox.Relay
		want string
	}{
		{outbox.Relay{Brokers: []string{"b:9092"}}, "Relay.Pool"},
		{outbox.Relay{Pool: pool}, "Relay.Brokers"},
		{outbox.Relay{Pool: pool, Brokers: []string{"b:9092"}, PollInterval: -1}, "Relay.PollInterval"},
		{outbox.Relay{Pool: pool, Brokers: []string{"b:9092"}, RetryBase: time.Minute, RetryMax: time.Second}, "Relay.RetryBase"},
		{outbox.Relay{Pool: pool, Brokers: []string{"b:9092"}, Table: "s."}, "table name"},
		{outbox.Relay{Pool: pool, Brokers: []string{"b:9092"}, ExactlyOnce: true, Sarama: oldKafka()}, "Relay.Sarama.Version"},
	} {
		err := c.r.Validate()
		if !errors.Is(err, outbox.ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate() = %v, want ErrInvalidConfig naming %s", err, c.want)
		}
	}
}

// TestNotifyWakesRelay: with a polling fallback of an hour, only the NOTIFY
// of a commit (and of Retry) can wake the relay; both do.
func TestNotifyWakesRelay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	recs := e.consume(e.topic)
	// A failed row from before the relay started (its INSERT's NOTIFY had no listener).
	var id int64
	if err := e.pool.QueryRow(t.Context(), `INSERT INTO idem_outbox (topic, key, value, state, attempts, last_error)
		VALUES ($1, 'b', 'retried', 'failed', 10, 'test') RETURNING id`, e.topic).Scan(&id); err != nil {
		t.Fatal(err)
	}
	r, reg := e.relay(e.pool)
	r.PollInterval = time.Hour
	start(t, r)
	waitMetric(t, reg, 1, "idem_outbox_leader", "idem_outbox")
	e.enqueue(e.msg("a", "committed"))
	recs.waitKeys(t, "a")
	if done, err := outbox.Retry(t.Context(), e.pool, "", id); err != nil || len(done) != 1 {
		t.Fatalf("Retry = %v, %v", done, err)
	}
	recs.waitKeys(t, "b")
}

// TestRejectedOnlyForTheRecordItself: errors about the record count against
// the row; errors about the cluster, the credentials or the topic are
// outages (the classification the relay applies to each failed publish).
func TestRejectedOnlyForTheRecordItself(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("kafka: produce: %w", err) }
	for _, c := range []struct {
		err      error
		rejected bool
		reason   string
	}{
		{sarama.ErrMessageSizeTooLarge, true, "too_large"},
		{wrap(sarama.ErrMessageSetSizeTooLarge), true, "too_large"},
		{sarama.ConfigurationError("Attempt to produce message larger than configured Producer.MaxMessageBytes: 2097231 > 1000000"), true, "too_large"},
		{sarama.ErrInvalidRecord, true, "other"},
		{sarama.ErrInvalidTimestamp, true, "other"},
		{sarama.ErrSASLAuthenticationFailed, false, "authorization"},
		{wrap(sarama.ErrClusterAuthorizationFailed), false, "authorization"},
		{sarama.ErrTopicAuthorizationFailed, false, "authorization"},
		{sarama.ErrUnknownTopicOrPartition, false, "unknown_topic"},
		{sarama.ErrInvalidTopic, false, "unknown_topic"},
		{sarama.ErrOutOfBrokers, false, "other"},
		{sarama.ErrNotEnoughReplicas, false, "other"},
		{errors.New("i/o timeout"), false, "other"},
	} {
		if got := outbox.Rejected(c.err); got != c.rejected {
			t.Errorf("Rejected(%v) = %v, want %v", c.err, got, c.rejected)
		}
		if got := outbox.Reason(c.err); got != c.reason {
			t.Errorf("Reason(%v) = %q, want %q", c.err, got, c.reason)
		}
	}
}

// oldKafka is a sarama config for Kafka 2.4, which has no KIP-447 fencing.
func oldKafka() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V2_4_0_0
	return c
}

package outbox_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/outbox"
)

// dbNow is the database's clock, the one NotBefore is compared with.
func (e *env) dbNow() time.Time {
	e.t.Helper()
	var now time.Time
	if err := e.pool.QueryRow(e.t.Context(), "SELECT clock_timestamp()").Scan(&now); err != nil {
		e.t.Fatal(err)
	}
	return now
}

func (e *env) delayed(key, value string, at time.Time) outbox.Message {
	m := e.msg(key, value)
	m.NotBefore = at
	return m
}

// record returns the record of recs with value v, or nil.
func (r *records) record(v string) *sarama.ConsumerMessage {
	for _, m := range r.snapshot() {
		if string(m.Value) == v {
			return m
		}
	}
	return nil
}

// TestNotBefore: in both relay modes, a delayed row is not published before
// its NotBefore while undelayed rows enqueued after it are, and is published
// once due by the relay's timer alone (PollInterval is 10 minutes, and no
// NOTIFY comes after the last enqueue). Per key, rows go out in enqueue
// order: a delayed row holds back its key's later rows, even one due
// earlier (K) or not delayed (D), and never the rows before it (A).
func TestNotBefore(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"at-least-once", "exactly-once"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			r, _ := e.relay(e.pool)
			if mode == "exactly-once" {
				r, _ = e.txnRelay()
			}
			r.PollInterval = 10 * time.Minute
			start(t, r)
			recs := e.consumeAt(e.topic, sarama.ReadCommitted)

			now := e.dbNow()
			dueD, dueK1, dueK2 := now.Add(3*time.Second), now.Add(4*time.Second), now.Add(2*time.Second)
			e.enqueue(e.msg("A", "a1"), e.delayed("A", "a2", now.Add(time.Hour)),
				e.delayed("D", "d1", dueD), e.delayed("K", "k1", dueK1))
			e.enqueue(e.msg("D", "d2"), e.delayed("K", "k2", dueK2), e.msg("N", "n"))

			recs.waitKeys(t, "N", "A")
			got := recs.snapshot()
			if e.dbNow().Before(dueK2) {
				for _, m := range got {
					if k := string(m.Key); k == "D" || k == "K" {
						t.Fatalf("%s published before it was due (undelayed rows enqueued after it are out: N, A)", m.Value)
					}
				}
			} else {
				t.Logf("the undelayed rows took longer than the shortest delay; only the timestamps are checked")
			}

			recs.waitKeys(t, "D", "K")
			idemtest.Eventually(t, 60*time.Second, func() error {
				if d, k := recs.values("D"), recs.values("K"); len(d) < 2 || len(k) < 2 {
					return fmt.Errorf("D: %v, K: %v", d, k)
				}
				return nil
			})
			for k, want := range map[string][]string{"A": {"a1"}, "D": {"d1", "d2"}, "K": {"k1", "k2"}, "N": {"n"}} {
				if v := recs.values(k); !slices.Equal(v, want) {
					t.Errorf("key %s: %v, want %v", k, v, want)
				}
			}
			// Record timestamps are the producer's clock at send, on the
			// database's host; Kafka keeps milliseconds.
			for v, due := range map[string]time.Time{"d1": dueD, "k1": dueK1, "k2": dueK1} {
				if m := recs.record(v); m == nil || m.Timestamp.Before(due.Truncate(time.Millisecond)) {
					t.Errorf("%s: published at %v, due %v", v, m.Timestamp, due)
				}
			}
			if n := e.count("value = 'a2' AND state = 'pending' AND not_before > now()"); n != 1 {
				t.Errorf("a2 (due in an hour): %d pending rows, want 1", n)
			}
		})
	}
}

// TestNotBeforeInThePast: a NotBefore in the past (any past, year 1
// included) means as soon as possible; List shows NotBefore. (A NotBefore
// PostgreSQL cannot store: TestEnqueueRejectsBadMessages.)
func TestNotBeforeInThePast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := t.Context()
	later := e.dbNow().Add(time.Hour)
	e.enqueue(e.delayed("L", "later", later))
	rows, err := outbox.List(ctx, e.pool, outbox.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || !rows[0].NotBefore.Equal(later.Truncate(time.Microsecond)) || !rows[0].RetryAt.Equal(rows[0].NotBefore) {
		t.Fatalf("List: %+v, want one row with NotBefore = RetryAt = %v", rows, later)
	}

	e.enqueue(e.delayed("Y", "year1", time.Date(1, 1, 1, 0, 0, 0, 1, time.UTC)),
		e.delayed("E", "epoch", time.Unix(0, 0)), e.delayed("P", "past", time.Now().Add(-time.Second)))
	// Past times are stored, and the rows are read as undelayed ones.
	if n := e.count("retry_at IS NULL AND not_before < now()"); n != 3 {
		t.Fatalf("%d past-due rows with no retry_at, want 3", n)
	}
	r, _ := e.relay(e.pool)
	r.PollInterval = 10 * time.Minute
	start(t, r)
	recs := e.consume(e.topic)
	recs.waitKeys(t, "Y", "E", "P")
	e.waitCount(30*time.Second, 1, "true") // "later" waits
}

// TestNotBeforeHeldRowDoesNotSpin: a row that is due but held back by an
// earlier delayed row of its key (k2, due 1s before k1) does not make the
// idle leader wake every millisecond until k1 is due: the leader waits for
// the first waiting row that nothing holds back (k1).
func TestNotBeforeHeldRowDoesNotSpin(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	r, _ := e.relay(e.pool)
	r.PollInterval = 10 * time.Minute
	var mu sync.Mutex
	var short int
	outbox.SetIdle(r, func(wait time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		if wait < 100*time.Millisecond {
			short++
		}
	})
	start(t, r)
	recs := e.consume(e.topic)
	now := e.dbNow()
	e.enqueue(e.delayed("K", "k1", now.Add(3*time.Second)), e.delayed("K", "k2", now.Add(time.Second)))
	idemtest.Eventually(t, 60*time.Second, func() error {
		if v := recs.values("K"); len(v) < 2 {
			return fmt.Errorf("K: %v", v)
		}
		return nil
	})
	if v := recs.values("K"); !slices.Equal(v, []string{"k1", "k2"}) {
		t.Fatalf("K: %v, want [k1 k2]", v)
	}
	mu.Lock()
	defer mu.Unlock()
	// Without the rule it is about one per millisecond for 2s; with it, at
	// most one when a wake-up happens to fall just before k1 is due.
	if short > 5 {
		t.Fatalf("%d idle waits shorter than 100ms while k2 was held back by k1", short)
	}
}

// TestNotBeforeOldestPendingLeavesOutWaitingRows: rows that cannot be
// published yet leave idem_outbox_oldest_pending_seconds at 0: rows delayed
// to a later time (A, C) and B, enqueued undelayed behind A on A's key,
// which waits for A by design (an IdemOutboxStuck page for it would be
// false). A failed row (F) is not pending. The gauge is read after a
// refresh that saw every row: idem_outbox_failed moves to 1 only once F
// is inserted, after a refresh already counted the three pending rows.
func TestNotBeforeOldestPendingLeavesOutWaitingRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	r, reg := e.relay(e.pool)
	start(t, r)
	later := e.dbNow().Add(time.Hour)
	e.enqueue(e.delayed("K", "a", later), e.msg("K", "b"), e.delayed("N", "c", later))
	gauge := func(name string, want float64) {
		t.Helper()
		idemtest.Eventually(t, 30*time.Second, func() error {
			if v := metric(t, reg, name, "idem_outbox"); v != want {
				return fmt.Errorf("%s = %v, want %v", name, v, want)
			}
			return nil
		})
	}
	gauge("idem_outbox_pending", 3)
	if _, err := e.pool.Exec(t.Context(), `INSERT INTO idem_outbox (topic, key, value, state, attempts, rejections)
		VALUES ($1, 'F', 'f', 'failed', 10, 10)`, e.topic); err != nil {
		t.Fatal(err)
	}
	gauge("idem_outbox_failed", 1)
	if o := metric(t, reg, "idem_outbox_oldest_pending_seconds", "idem_outbox"); o != 0 {
		t.Fatalf("idem_outbox_oldest_pending_seconds = %v, want 0: nothing can be published before %v", o, later)
	}
}

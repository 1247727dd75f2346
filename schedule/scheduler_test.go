package schedule_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemhq/idem/idemtest"
	"github.com/idemhq/idem/internal/testing/testenv"
	"github.com/idemhq/idem/internal/wire"
	"github.com/idemhq/idem/schedule"
)

// TestDeferredPublishedOnceAfterTheirTime (issue 21, test 5's scheduler
// half): 100 records deferred by 5 s are each published once, not before
// their time by the database's clock, with key, value, headers and
// partition kept; the metrics count them.
func TestDeferredPublishedOnceAfterTheirTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	col := e.collect()
	s, reg := e.scheduler()
	run(t, s)

	at := e.dbNow().Add(5 * time.Second)
	recs := make([]schedule.Record, 100)
	for i := range recs {
		recs[i] = e.record(i)
	}
	e.deferAll(at, recs...)
	waitMetric(t, reg, "idem_schedule_pending", 100, e.group)

	col.waitKeys(t, 100)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := e.pending(); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
	byKey := col.byKey()
	for i, r := range recs {
		got := byKey[string(r.Key)]
		if len(got) != 1 {
			t.Fatalf("key %s published %d times, want once", r.Key, len(got))
		}
		m := got[0].m
		if got[0].dbAt.Before(at) {
			t.Errorf("key %s read at %s by the database clock, before its due time %s", r.Key, got[0].dbAt, at)
		}
		if m.Timestamp.Before(at.Truncate(time.Millisecond)) {
			t.Errorf("key %s published at %s (record timestamp), before its due time %s", r.Key, m.Timestamp, at)
		}
		if string(m.Value) != string(r.Value) || m.Partition != int32(i%3) ||
			header(m, "idempotency-key") != r.IdempotencyKey || header(m, "idem-original-offset") != fmt.Sprint(i) {
			t.Fatalf("record %s changed: partition %d value %q headers %v", r.Key, m.Partition, m.Value, m.Headers)
		}
		if f, _, err := wire.Decode(m.Headers); err != nil || f.OriginalTopic != "payments" || f.OriginalPartition != int32(i%3) ||
			f.OriginalOffset != int64(i) || f.OriginalTimestamp.UnixMilli() != 1_700_000_000_000 || f.IdempotencyKey != r.IdempotencyKey {
			t.Fatalf("record %s: origin headers decode to %+v (%v)", r.Key, f, err)
		}
	}
	waitMetric(t, reg, "idem_schedule_published_total", 100, e.group)
	waitMetric(t, reg, "idem_schedule_pending", 0, e.group)
	if l := metric(t, reg, "idem_schedule_leader", e.group); l != 1 {
		t.Fatalf("idem_schedule_leader = %v, want 1", l)
	}
}

// TestRolledBackDeferIsNeverPublished: a Defer whose transaction rolls back
// leaves nothing to publish.
func TestRolledBackDeferIsNeverPublished(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := t.Context()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := schedule.Defer(ctx, tx, e.record(1), time.Time{}, nil); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	col := e.collect()
	s, reg := e.scheduler()
	run(t, s)
	e.deferAll(time.Time{}, e.record(2)) // zero: as soon as possible
	col.waitKeys(t, 1)
	waitMetric(t, reg, "idem_schedule_published_total", 1, e.group)
	if k := string(col.snapshot()[0].m.Key); k != "k002" {
		t.Fatalf("published %s, want only k002", k)
	}
}

const (
	childEnv    = "IDEM_SCHEDULE_CRASH_CHILD" // schema,group,topic of the child's scheduler
	ackedMarker = "IDEM-SCHEDULE-CHILD-ACKED"
)

// TestSchedulerChildProcess is the leader the crash test runs in a child
// process (it does nothing in a normal run): it publishes 10 records a
// round, prints ackedMarker after the first round's acks, and waits there,
// before deleting anything, for its SIGKILL.
func TestSchedulerChildProcess(t *testing.T) {
	e := childEnvOf(t)
	if e == nil {
		return
	}
	s, _ := e.scheduler()
	s.BatchSize = 10
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schedule.SetAfterAck(s, func(ids []int64) {
		if len(ids) > 0 {
			fmt.Printf("\n%s %v\n", ackedMarker, ids)
			<-ctx.Done() // the parent kills us here
		}
	})
	_ = s.Run(ctx)
	t.Fatal("the child was not killed within a minute")
}

// TestLeaderSIGKILLLosesNone (issue 21, test 5: "a SIGKILL of the
// scheduler's leader loses none"): the leader, in a child process, is killed
// after Kafka acked its first round of 10 and before it deleted them. The
// standby takes over and publishes every record; the 10 of the killed round
// go out twice, as identical copies (same idempotency key), which the
// consumer's inbox turns into one handling.
func TestLeaderSIGKILLLosesNone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	col := e.collect()
	recs := make([]schedule.Record, 100)
	for i := range recs {
		recs[i] = e.record(i)
	}
	e.deferAll(e.dbNow().Add(time.Second), recs...)

	c := e.startChild("TestSchedulerChildProcess")
	if _, ok := c.WaitFor(func(line string) bool { return strings.HasPrefix(line, ackedMarker) }); !ok {
		t.Fatalf("the child scheduler exited without reporting an ack; stderr:\n%s", c.Stderr())
	}
	// The standby starts while the child still leads, and waits for the lock.
	standby, reg := e.scheduler()
	run(t, standby)
	c.Kill(t)

	col.waitKeys(t, 100)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := e.pending(); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
	waitMetric(t, reg, "idem_schedule_leader", 1, e.group)
	twice := 0
	for key, copies := range col.byKey() {
		switch len(copies) {
		case 1:
		case 2:
			twice++
			a, b := copies[0].m, copies[1].m
			if string(a.Value) != string(b.Value) || header(a, "idempotency-key") != header(b, "idempotency-key") {
				t.Fatalf("copies of %s differ: %q %v / %q %v", key, a.Value, a.Headers, b.Value, b.Headers)
			}
		default:
			t.Fatalf("key %s published %d times", key, len(copies))
		}
	}
	if twice != 10 {
		t.Fatalf("%d records published twice, want the 10 of the killed round", twice)
	}
	// The standby published the 90 the child never acked, and the 10 again.
	waitMetric(t, reg, "idem_schedule_published_total", 100, e.group)
}

// TestStandbyWaitsForTheLeader: of two schedulers of a group one leads; of
// two groups each has its own leader.
func TestOneLeaderPerGroup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	a, regA := e.scheduler()
	b, regB := e.scheduler()
	run(t, a)
	run(t, b)
	idemtest.Eventually(t, 30*time.Second, func() error {
		la, lb := metric(t, regA, "idem_schedule_leader", e.group), metric(t, regB, "idem_schedule_leader", e.group)
		if la+lb != 1 {
			return fmt.Errorf("leaders: %v + %v, want exactly one", la, lb)
		}
		return nil
	})
	other := *e
	other.group = e.k.Group(t, "g_other")
	c, regC := other.scheduler()
	run(t, c)
	waitMetric(t, regC, "idem_schedule_leader", 1, other.group)
}

// metric returns the value of the gauge or counter name for group, or 0.
func metric(t testing.TB, reg *prometheus.Registry, name, group string) float64 {
	t.Helper()
	return testenv.Metric(t, reg, name, map[string]string{"group": group})
}

func waitMetric(t testing.TB, reg *prometheus.Registry, name string, want float64, group string) {
	t.Helper()
	idemtest.Eventually(t, 60*time.Second, func() error {
		if got := metric(t, reg, name, group); got != want {
			return fmt.Errorf("%s{group=%s} = %v, want %v", name, group, got, want)
		}
		return nil
	})
}

// TestMissingTopicIsWaitedOut: a due record for a topic that does not exist
// yet is never deleted; its failures are counted and shown, and it is
// published once the topic exists.
func TestMissingTopicIsWaitedOut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.topic += ".not_yet" // created below, and deleted with the test's topic
	s, reg := e.scheduler()
	run(t, s)
	e.deferAll(time.Time{}, e.record(7))
	idemtest.Eventually(t, 60*time.Second, func() error {
		ps, err := schedule.List(t.Context(), e.pool, schedule.Filter{Group: e.group})
		if err != nil {
			return err
		}
		if len(ps) != 1 || ps[0].Attempts < 2 || !strings.Contains(ps[0].LastError, e.topic) {
			return fmt.Errorf("rows %+v: want one with 2+ failed attempts naming the topic", ps)
		}
		return nil
	})
	if n := metric(t, reg, "idem_schedule_publish_failures_total", e.group); n < 2 {
		t.Fatalf("idem_schedule_publish_failures_total = %v", n)
	}
	e.k.CreateTopic(t, e.topic, 1)
	col := e.collect()
	col.waitKeys(t, 1)
	waitMetric(t, reg, "idem_schedule_published_total", 1, e.group)
	idemtest.Eventually(t, 30*time.Second, func() error {
		if n := e.pending(); n != 0 {
			return fmt.Errorf("%d rows left", n)
		}
		return nil
	})
}

// TestIdleLeaderWakesForNewRows: a leader with nothing due sleeps (here up
// to an hour: MaxWait and StatsInterval), yet a row committed meanwhile is
// published at its due time: the insert's NOTIFY wakes the leader, which
// then sleeps by a timer until the new row is due, not before.
func TestIdleLeaderWakesForNewRows(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	col := e.collect()
	s, reg := e.scheduler()
	s.MaxWait, s.StatsInterval = time.Hour, time.Hour
	run(t, s)
	waitMetric(t, reg, "idem_schedule_leader", 1, e.group)

	at := e.dbNow().Add(2 * time.Second)
	e.deferAll(at, e.record(1))
	col.waitKeys(t, 1) // well within the hour
	if got := col.snapshot()[0]; got.dbAt.Before(at) || got.m.Timestamp.Before(at.Truncate(time.Millisecond)) {
		t.Fatalf("published at %s (read at %s by the database clock), before its due time %s", got.m.Timestamp, got.dbAt, at)
	}
	e.deferAll(time.Time{}, e.record(2))
	col.waitKeys(t, 2)
}

// TestSameGroupInTwoSchemasHasTwoLeaders: advisory locks are database-wide,
// so the lock names the table too: a group of the same name in another
// schema (another service on the same database) has its own leader, and its
// rows are published.
func TestSameGroupInTwoSchemasHasTwoLeaders(t *testing.T) {
	t.Parallel()
	a, b := newEnv(t, 1), newEnv(t, 1)
	b.group = a.group
	sa, regA := a.scheduler()
	sb, regB := b.scheduler()
	run(t, sa)
	run(t, sb)
	waitMetric(t, regA, "idem_schedule_leader", 1, a.group)
	waitMetric(t, regB, "idem_schedule_leader", 1, b.group)
	col := b.collect()
	b.deferAll(time.Time{}, b.record(1))
	col.waitKeys(t, 1)
}
